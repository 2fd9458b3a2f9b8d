#include "iprobe/hotpatch/trace_file.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "iprobe/support/error.h"

namespace iprobe::hotpatch {

namespace {

constexpr char kMagic[8] = {'I', 'P', 'R', 'B', 'T', 'R', 'C', '1'};
constexpr char kEnd[8] = {'I', 'P', 'R', 'B', 'E', 'N', 'D', '1'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeader = 24, kFooter = 16, kEventHead = 20;

std::uint8_t kind_code(probelist::ProbeKind k) { return k == probelist::ProbeKind::entry ? 0 : k == probelist::ProbeKind::exit ? 1 : 2; }

probelist::ProbeKind kind_of(std::uint8_t code, const std::string& path) {
    if (code > 2) throw Error(path + ": corrupt trace file (event kind " + std::to_string(code) + ")", ExitCode::bad_input);
    return code == 0 ? probelist::ProbeKind::entry : code == 1 ? probelist::ProbeKind::exit : probelist::ProbeKind::point;
}

template <typename T>
void put(std::string& out, T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Bounds-checked little cursor over the file's bytes.
class Cursor {
public:
    Cursor(const std::string& bytes, std::size_t at, std::size_t end, const std::string& path)
        : bytes_(bytes), at_(at), end_(end), path_(path) {}
    template <typename T>
    T get() {
        T v;
        need(sizeof v);
        std::memcpy(&v, bytes_.data() + at_, sizeof v);
        at_ += sizeof v;
        return v;
    }
    std::string string(std::size_t n) {
        need(n);
        std::string s = bytes_.substr(at_, n);
        at_ += n;
        return s;
    }
    bool done() const { return at_ >= end_; }

private:
    void need(std::size_t n) {
        if (n > end_ - at_) throw Error(path_ + ": corrupt trace file (truncated record)", ExitCode::bad_input);
    }
    const std::string& bytes_;
    std::size_t at_, end_;
    const std::string& path_;
};

}  // namespace

TraceFileWriter::TraceFileWriter(const std::string& path, pid_t pid) : path_(path) {
    file_ = std::fopen(path.c_str(), "wb");
    if (!file_) throw_errno("cannot write " + path);
    std::string head(kMagic, sizeof kMagic);
    put(head, kVersion);
    put(head, static_cast<std::uint32_t>(pid));
    put(head, std::uint64_t{0});
    std::fwrite(head.data(), 1, head.size(), file_);
}

TraceFileWriter::~TraceFileWriter() {
    if (file_) std::fclose(file_);
}

void TraceFileWriter::write(const Event& e) {
    char buf[kEventHead + sizeof e.args];
    const std::uint8_t kind = kind_code(e.kind), nargs = std::min<std::uint8_t>(e.nargs, 4);
    std::memcpy(buf, &e.time_ns, 8);
    std::memcpy(buf + 8, &e.probe, 4);
    std::memcpy(buf + 12, &e.tid, 4);
    buf[16] = static_cast<char>(kind);
    buf[17] = static_cast<char>(nargs);
    std::memcpy(buf + 18, &e.depth, 2);
    std::memcpy(buf + kEventHead, e.args, 8u * nargs);
    std::fwrite(buf, 1, kEventHead + 8u * nargs, file_);
    events_++;
}

void TraceFileWriter::finish(const std::vector<ProbeInfo>& probes) {
    const long table_at = std::ftell(file_);
    std::string table;
    put(table, static_cast<std::uint32_t>(probes.size()));
    for (const auto& p : probes) {
        const std::string name = p.function.substr(0, 0xffff);
        put(table, kind_code(p.kind));
        put(table, static_cast<std::uint16_t>(name.size()));
        table += name;
    }
    put(table, static_cast<std::uint64_t>(table_at));
    table.append(kEnd, sizeof kEnd);
    std::fwrite(table.data(), 1, table.size(), file_);
    if (std::fflush(file_) != 0 || std::ferror(file_)) throw_errno("cannot write " + path_);
}

TraceFile read_trace_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read " + path, ExitCode::not_found);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (bytes.size() < kHeader + kFooter || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0)
        throw Error(path + " is not an iprobe trace file (written by 'iprobe trace --output')", ExitCode::bad_input);
    if (std::memcmp(bytes.data() + bytes.size() - sizeof kEnd, kEnd, sizeof kEnd) != 0)
        throw Error(path + ": the trace file ends early (the trace was killed before it finished)", ExitCode::bad_input);
    TraceFile out;
    Cursor head(bytes, sizeof kMagic, kHeader, path);
    if (head.get<std::uint32_t>() != kVersion) throw Error(path + ": unknown trace file version", ExitCode::bad_input);
    out.pid = static_cast<pid_t>(head.get<std::uint32_t>());
    std::uint64_t table_at;
    std::memcpy(&table_at, bytes.data() + bytes.size() - kFooter, 8);
    if (table_at < kHeader || table_at > bytes.size() - kFooter)
        throw Error(path + ": corrupt trace file (probe table offset)", ExitCode::bad_input);
    Cursor table(bytes, table_at, bytes.size() - kFooter, path);
    const std::uint32_t count = table.get<std::uint32_t>();
    if (count > bytes.size()) throw Error(path + ": corrupt trace file (probe count)", ExitCode::bad_input);
    for (std::uint32_t i = 0; i < count; i++) {
        ProbeInfo p;
        p.kind = kind_of(table.get<std::uint8_t>(), path);
        p.function = table.string(table.get<std::uint16_t>());
        out.probes.push_back(std::move(p));
    }
    Cursor events(bytes, kHeader, table_at, path);
    while (!events.done()) {
        Event e;
        e.time_ns = events.get<std::uint64_t>();
        e.probe = events.get<std::uint32_t>();
        e.tid = events.get<std::uint32_t>();
        e.kind = kind_of(events.get<std::uint8_t>(), path);
        e.nargs = events.get<std::uint8_t>();
        e.depth = events.get<std::uint16_t>();
        if (e.nargs > 4) throw Error(path + ": corrupt trace file (argument count)", ExitCode::bad_input);
        for (int i = 0; i < e.nargs; i++) e.args[i] = events.get<std::uint64_t>();
        out.events.push_back(e);
    }
    return out;
}

}  // namespace iprobe::hotpatch
