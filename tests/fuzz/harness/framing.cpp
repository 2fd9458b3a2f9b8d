// The divergence checker's framers (iprobe/proxy/framing.h) for RESP and
// HTTP, requests and responses.  Besides never crashing, a framer must cut
// a stream the same way however the network split it: fed whole and fed in
// pieces, it yields the same messages and fails at the same point.
#include "fuzz_input.h"
#include "iprobe/proxy/framing.h"

namespace {

using namespace iprobe::proxy;

std::vector<Message> frame(Protocol protocol, Role role, std::span<const std::uint8_t> bytes, std::size_t piece,
                           bool& failed) {
    static const DivergenceRules rules = DivergenceRules::defaults();
    auto framer = Framer::create(protocol, role, rules);
    std::vector<Message> out;
    for (std::size_t at = 0; at < bytes.size(); at += piece)
        framer->feed(bytes.subspan(at, std::min(piece, bytes.size() - at)), out);
    framer->finish(out);
    failed = framer->failed();
    return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 1) return 0;
    // First byte: protocol, role and the size of the pieces.
    const Protocol protocol = data[0] & 1 ? Protocol::http : Protocol::resp;
    const Role role = data[0] & 2 ? Role::response : Role::request;
    const std::size_t piece = 1 + (data[0] >> 2);
    const std::span<const std::uint8_t> stream(data + 1, size - 1);
    iprobe::fuzz::refusal_allowed([&] {
        bool failed_whole = false, failed_pieces = false;
        const auto whole = frame(protocol, role, stream, stream.size() + 1, failed_whole);
        const auto pieces = frame(protocol, role, stream, piece, failed_pieces);
        iprobe::fuzz::require(failed_whole == failed_pieces && whole.size() == pieces.size());
        for (std::size_t i = 0; i < whole.size(); i++)
            iprobe::fuzz::require(whole[i].hash == pieces[i].hash && whole[i].size == pieces[i].size);
    });
    return 0;
}
