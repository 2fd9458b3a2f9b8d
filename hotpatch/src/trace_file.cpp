#include "iprobe/hotpatch/trace_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

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
    // Events are small: written through a large buffer, unlocked (one writer).
    std::setvbuf(file_, nullptr, _IOFBF, 1u << 20);
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
    end_of_stream();
    if (buffer_.empty()) buffer_.resize(1u << 20);
    if (used_ + kEventHead + sizeof e.args > buffer_.size()) flush_buffer();
    char* buf = buffer_.data() + used_;
    const std::uint8_t kind = kind_code(e.kind), nargs = std::min<std::uint8_t>(e.nargs, 4);
    std::memcpy(buf, &e.time_ns, 8);
    std::memcpy(buf + 8, &e.probe, 4);
    std::memcpy(buf + 12, &e.tid, 4);
    buf[16] = static_cast<char>(kind);
    buf[17] = static_cast<char>(nargs);
    std::memcpy(buf + 18, &e.depth, 2);
    std::memcpy(buf + kEventHead, e.args, 8u * nargs);
    used_ += kEventHead + 8u * nargs;
    events_++;
}

void TraceFileWriter::flush_buffer() {
    if (used_ && ::fwrite_unlocked(buffer_.data(), 1, used_, file_) != used_) throw_errno("cannot write " + path_);
    used_ = 0;
}

void TraceFileWriter::end_of_stream() {
    if (!args_next_) return;
    buffer_[used_ - kEventHead + 17] = 0;  // the head still in the buffer: no arguments after all
    args_next_ = false;
    events_++;
}

void TraceFileWriter::write(const RecordRun& run, const WallClock& clock) {
    constexpr std::size_t kMost = kEventHead + 32;  // one event with its arguments
    if (buffer_.empty()) buffer_.resize(1u << 20);
    if (run.ring != ring_ || run.from != next_at_) {  // another ring, or a page of it skipped
        end_of_stream();
        values_next_ = 0;
    }
    ring_ = run.ring;
    next_at_ = run.to;
    for (std::uint64_t at = run.from; at < run.to; at++) {
        // Room for an event and its arguments: a head waiting for them is
        // never flushed, so end_of_stream() can still change it.
        if (!args_next_ && used_ + kMost > buffer_.size()) flush_buffer();
        const iprobe_rt_record& r = run.records[at & run.mask];
        if (values_next_) {  // an ENTRY's or EXIT's values: not in the file
            values_next_--;
            continue;
        }
        char* out = buffer_.data() + used_;
        if (args_next_) {  // the POINT's four arguments, its head already written
            std::memcpy(out, reinterpret_cast<const iprobe_rt_args_record*>(&r)->args, 32);
            used_ += 32;
            args_next_ = false;
            events_++;
            continue;
        }
        if (r.kind < IPROBE_RT_REC_ENTRY || r.kind > IPROBE_RT_REC_POINT) continue;
        const std::uint64_t time_ns = clock.ns(r.tsc);
        std::memcpy(out, &time_ns, 8);
        std::memcpy(out + 8, &r.probe, 4);
        std::memcpy(out + 12, &r.tid, 4);
        out[16] = static_cast<char>(r.kind - IPROBE_RT_REC_ENTRY);  // entry 0, exit 1, point 2
        // A point's arguments are in the next record; at the ring's end, none.
        const bool args = r.kind == IPROBE_RT_REC_POINT && r.nargs && !(run.last && at + 1 == run.to);
        out[17] = static_cast<char>(args ? 4 : 0);
        std::memcpy(out + 18, &r.depth, 2);
        used_ += kEventHead;
        if (args) args_next_ = true;
        else events_++;
        if (r.kind != IPROBE_RT_REC_POINT && r.nargs) {
            values_next_ = r.nargs;
            without_values_++;
        }
    }
}

void TraceFileWriter::finish(const std::vector<ProbeInfo>& probes) {
    end_of_stream();
    flush_buffer();
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

namespace {

// The probe table holds a name per probe of the traced process: 256 MiB is
// some millions of functions.
constexpr std::uint64_t kMaxTable = 256ull << 20;
constexpr std::size_t kChunk = 1u << 20;

void read_exactly(int fd, void* out, std::size_t size, std::uint64_t at, const std::string& path) {
    auto* p = static_cast<char*>(out);
    while (size > 0) {
        const ssize_t n = ::pread(fd, p, size, static_cast<off_t>(at));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("cannot read " + path, ExitCode::bad_input);
        if (n == 0) throw Error(path + ": the trace file changed size while being read", ExitCode::bad_input);
        p += n, at += static_cast<std::uint64_t>(n), size -= static_cast<std::size_t>(n);
    }
}

}  // namespace

TraceFileReader::TraceFileReader(const std::string& path) : path_(path) {
    std::uint64_t size = 0;
    fd_ = open_regular_file(path, &size).release();
    char head[kHeader];
    if (size < kHeader + kFooter || (read_exactly(fd_, head, sizeof head, 0, path), std::memcmp(head, kMagic, sizeof kMagic) != 0))
        throw Error(path + " is not an iprobe trace file (written by 'iprobe trace --output')", ExitCode::bad_input);
    char foot[kFooter];
    read_exactly(fd_, foot, sizeof foot, size - kFooter, path);
    if (std::memcmp(foot + 8, kEnd, sizeof kEnd) != 0)
        throw Error(path + ": the trace file ends early (the trace was killed before it finished)", ExitCode::bad_input);
    const std::string head_bytes(head, sizeof head);
    Cursor header(head_bytes, sizeof kMagic, kHeader, path);
    if (header.get<std::uint32_t>() != kVersion) throw Error(path + ": unknown trace file version", ExitCode::bad_input);
    pid_ = static_cast<pid_t>(header.get<std::uint32_t>());
    std::uint64_t table_at;
    std::memcpy(&table_at, foot, 8);
    if (table_at < kHeader || table_at > size - kFooter)
        throw Error(path + ": corrupt trace file (probe table offset)", ExitCode::bad_input);
    if (size - kFooter - table_at > kMaxTable)
        throw Error(path + ": corrupt trace file (a probe table of " + std::to_string(size - kFooter - table_at) +
                        " bytes)",
                    ExitCode::bad_input);
    std::string table_bytes(size - kFooter - table_at, '\0');
    read_exactly(fd_, table_bytes.data(), table_bytes.size(), table_at, path);
    Cursor table(table_bytes, 0, table_bytes.size(), path);
    const std::uint32_t count = table.get<std::uint32_t>();
    if (count > table_bytes.size() / 3) throw Error(path + ": corrupt trace file (probe count)", ExitCode::bad_input);
    probes_.reserve(count);
    for (std::uint32_t i = 0; i < count; i++) {
        ProbeInfo p;
        p.kind = kind_of(table.get<std::uint8_t>(), path);
        p.function = table.string(table.get<std::uint16_t>());
        probes_.push_back(std::move(p));
    }
    at_ = kHeader;
    end_ = table_at;
}

TraceFileReader::~TraceFileReader() {
    if (fd_ >= 0) ::close(fd_);
}

bool TraceFileReader::next(const std::function<void(const Event&)>& sink) {
    if (at_ >= end_) {
        if (!carry_.empty()) throw Error(path_ + ": corrupt trace file (truncated record)", ExitCode::bad_input);
        return false;
    }
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, end_ - at_));
    std::string bytes = std::move(carry_);
    const std::size_t from = bytes.size();
    bytes.resize(from + n);
    read_exactly(fd_, bytes.data() + from, n, at_, path_);
    at_ += n;
    carry_.clear();
    std::size_t used = 0;
    while (bytes.size() - used >= kEventHead) {
        const auto nargs = static_cast<std::uint8_t>(bytes[used + 17]);
        if (nargs > 4) throw Error(path_ + ": corrupt trace file (argument count)", ExitCode::bad_input);
        const std::size_t length = kEventHead + 8u * nargs;
        if (bytes.size() - used < length) break;
        Cursor event(bytes, used, used + length, path_);
        Event e;
        e.time_ns = event.get<std::uint64_t>();
        e.probe = event.get<std::uint32_t>();
        e.tid = event.get<std::uint32_t>();
        e.kind = kind_of(event.get<std::uint8_t>(), path_);
        e.nargs = event.get<std::uint8_t>();
        e.depth = event.get<std::uint16_t>();
        for (int i = 0; i < e.nargs; i++) e.args[i] = event.get<std::uint64_t>();
        sink(e);
        used += length;
    }
    carry_ = bytes.substr(used);
    return true;
}

}  // namespace iprobe::hotpatch
