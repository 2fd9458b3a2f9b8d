#include "iprobe/hotpatch/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <utility>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"

namespace iprobe::hotpatch {

namespace {

constexpr char kMagic[8] = {'I', 'P', 'R', 'B', 'T', 'R', 'C', '1'};
constexpr char kEnd[8] = {'I', 'P', 'R', 'B', 'E', 'N', 'D', '1'};
constexpr std::uint32_t kVersion = 2;
constexpr std::size_t kHeaderV1 = 24, kHeader = 40, kFooter = 16, kEventHead = 20, kBlockHead = 16;
constexpr std::uint64_t kEscape = 3, kProbeLimit = 1u << 22, kDeltaLimit = 1ull << 40;
// The writer's buffer: handed to the file once past kFlushAt; the slack
// holds one run (a page of records) encoded at its longest.
constexpr std::size_t kFlushAt = 1u << 20, kRunSlack = 64u << 10;
constexpr std::uint64_t kPrefetchAhead = 16;  // records (8 cache lines)

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

TraceFileWriter::TraceFileWriter(const std::string& path, pid_t pid, const WallClock& clock) : path_(path) {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_errno("cannot write " + path);
    buffer_.resize(kFlushAt + kRunSlack);
    std::string head(kMagic, sizeof kMagic);
    put(head, kVersion);
    put(head, static_cast<std::uint32_t>(pid));
    put(head, clock.tsc_base);
    put(head, clock.realtime_base);
    put(head, clock.ns_per_tick);
    std::memcpy(buffer_.data(), head.data(), head.size());
    used_ = head.size();
}

TraceFileWriter::~TraceFileWriter() {
    if (fd_ >= 0) ::close(fd_);
}

void TraceFileWriter::write_out(const char* data, std::size_t size) {
    while (size > 0) {
        const ssize_t n = ::write(fd_, data, size);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw_errno("cannot write " + path_);
        data += n, size -= static_cast<std::size_t>(n), written_ += static_cast<std::uint64_t>(n);
    }
}

void TraceFileWriter::flush() {
    close_block();
    write_out(buffer_.data(), used_);
    used_ = 0;
}

void TraceFileWriter::open_block(std::uint32_t tid, std::uint64_t tsc) {
    close_block();
    block_ = used_;
    block_tid_ = tid;
    previous_tsc_ = tsc;
    char* head = buffer_.data() + used_;
    std::memcpy(head, &tid, 4);
    std::memset(head + 4, 0, 4);
    std::memcpy(head + 8, &tsc, 8);
    used_ += kBlockHead;
}

void TraceFileWriter::close_block() {
    if (block_ == kNoBlock) return;
    end_point();
    const auto words = static_cast<std::uint32_t>((used_ - block_ - kBlockHead) / 8);
    if (words == 0) used_ = block_;  // nothing in it
    else std::memcpy(buffer_.data() + block_ + 4, &words, 4);
    block_ = kNoBlock;
}

// The POINT's argument record never came (its ring's next page was
// skipped): the escape keeps the point, without arguments.
void TraceFileWriter::end_point() {
    if (point_ == kNoBlock) return;
    const std::uint64_t escape = kEscape | 1u << 2;
    std::memcpy(buffer_.data() + point_, &escape, 8);
    buffer_[point_ + 8 + offsetof(iprobe_rt_record, nargs)] = 0;
    point_ = kNoBlock;
}

void TraceFileWriter::write(const RecordRun& run) {
    if (run.ring != ring_ || run.from != next_at_) {  // another ring, or a page of it skipped
        close_block();
        values_left_ = 0;
    }
    ring_ = run.ring;
    next_at_ = run.to;
    // A block is written whole, so never flushed while a point waits for
    // its argument record; the buffer's slack holds one run at 5 words a
    // record (an escape), and grows for a longer run.
    if (used_ >= kFlushAt && point_ == kNoBlock) flush();
    const std::size_t most = used_ + (run.to - run.from) * (kBlockHead + 40);  // a block and an escape each, at most
    if (most > buffer_.size()) buffer_.resize(most);
    char* const base = buffer_.data();
    char* out = base + used_;
    std::uint64_t previous = previous_tsc_;
    for (std::uint64_t at = run.from; at < run.to; at++) {
        const iprobe_rt_record& r = run.records[at & run.mask];
        // The target's core wrote these lines: ask for them well ahead.
        __builtin_prefetch(&run.records[(at + kPrefetchAhead) & run.mask]);
        if (values_left_) {  // an ENTRY's or EXIT's values: not in the file
            values_left_--;
            continue;
        }
        if (point_ != kNoBlock) {  // the POINT's argument record, its head already written
            std::memcpy(out, &r, sizeof r);
            out += sizeof r;
            point_ = kNoBlock;
            continue;
        }
        if (block_ == kNoBlock || r.tid != block_tid_) {
            used_ = static_cast<std::size_t>(out - base);
            open_block(r.tid, r.tsc);
            out = base + used_;
            previous = r.tsc;
        }
        const std::uint64_t delta = r.tsc - previous;
        const std::uint32_t kind = r.kind - 1u;  // entry 0, exit 1, point 2
        if (kind < 3 && (r.nargs | r.depth) == 0 && r.probe < kProbeLimit && delta < kDeltaLimit) [[likely]] {
            const std::uint64_t word = kind | std::uint64_t{r.probe} << 2 | delta << 24;
            std::memcpy(out, &word, 8);
            out += 8;
            previous = r.tsc;
            events_++;
            continue;
        }
        if (kind >= 3) continue;  // a continuation record without its head: not an event
        const bool point_args = r.kind == IPROBE_RT_REC_POINT && r.nargs;
        if (r.kind != IPROBE_RT_REC_POINT && r.nargs) {
            values_left_ = r.nargs;
            without_values_++;
        }
        const std::uint64_t escape = kEscape | (point_args ? 2u : 1u) << 2;
        std::memcpy(out, &escape, 8);
        if (point_args) point_ = static_cast<std::size_t>(out - base);
        std::memcpy(out + 8, &r, sizeof r);
        if (!point_args) out[8 + offsetof(iprobe_rt_record, nargs)] = 0;  // its values are not in the file
        out += 8 + sizeof r;
        previous = r.tsc;
        events_++;
    }
    used_ = static_cast<std::size_t>(out - base);
    previous_tsc_ = previous;
}

void TraceFileWriter::finish(const std::vector<ProbeInfo>& probes) {
    flush();
    const std::uint64_t table_at = written_;
    std::string table;
    put(table, static_cast<std::uint32_t>(probes.size()));
    for (const auto& p : probes) {
        const std::string name = p.function.substr(0, 0xffff);
        put(table, kind_code(p.kind));
        put(table, static_cast<std::uint16_t>(name.size()));
        table += name;
    }
    put(table, table_at);
    table.append(kEnd, sizeof kEnd);
    write_out(table.data(), table.size());
    if (::close(std::exchange(fd_, -1)) != 0) throw_errno("cannot write " + path_);
}

namespace {

// The probe table holds a name per probe of the traced process: 256 MiB is
// some millions of functions.
constexpr std::uint64_t kMaxTable = 256ull << 20;
constexpr std::size_t kChunk = 1u << 20;
constexpr std::uint64_t kMaxBlock = 64ull << 20;  // the writer's are near 1 MiB

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
    if (size < kHeaderV1 + kFooter ||
        (read_exactly(fd_, head, kHeaderV1, 0, path), std::memcmp(head, kMagic, sizeof kMagic) != 0))
        throw Error(path + " is not an iprobe trace file (written by 'iprobe trace --output')", ExitCode::bad_input);
    char foot[kFooter];
    read_exactly(fd_, foot, sizeof foot, size - kFooter, path);
    if (std::memcmp(foot + 8, kEnd, sizeof kEnd) != 0)
        throw Error(path + ": the trace file ends early (the trace was killed before it finished)", ExitCode::bad_input);
    std::memcpy(&version_, head + sizeof kMagic, 4);
    if (version_ != 1 && version_ != 2)
        throw Error(path + ": unknown trace file version " + std::to_string(version_) + " (this iprobe reads 1 and 2)",
                    ExitCode::bad_input);
    const std::size_t header_size = version_ == 1 ? kHeaderV1 : kHeader;
    if (size < header_size + kFooter) throw Error(path + ": corrupt trace file (header)", ExitCode::bad_input);
    if (version_ == 2) read_exactly(fd_, head, kHeader, 0, path);
    const std::string head_bytes(head, header_size);
    Cursor header(head_bytes, sizeof kMagic + 4, header_size, path);
    pid_ = static_cast<pid_t>(header.get<std::uint32_t>());
    if (version_ == 2) {
        clock_.tsc_base = header.get<std::uint64_t>();
        clock_.realtime_base = header.get<std::uint64_t>();
        clock_.ns_per_tick = header.get<double>();
        if (!(clock_.ns_per_tick > 0 && clock_.ns_per_tick < 1e6))
            throw Error(path + ": corrupt trace file (clock)", ExitCode::bad_input);
    }
    std::uint64_t table_at;
    std::memcpy(&table_at, foot, 8);
    if (table_at < header_size || table_at > size - kFooter)
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
    at_ = header_size;
    end_ = table_at;
}

TraceFileReader::~TraceFileReader() {
    if (fd_ >= 0) ::close(fd_);
}

bool TraceFileReader::next(const std::function<void(const Event&)>& sink) {
    return version_ == 1 ? next_v1(sink) : next_v2(sink);
}

bool TraceFileReader::next_v1(const std::function<void(const Event&)>& sink) {
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

// A block at a time (the writer keeps them near 1 MiB): the chunk read
// grows to hold the block it cuts.
bool TraceFileReader::next_v2(const std::function<void(const Event&)>& sink) {
    if (at_ >= end_) {
        if (!carry_.empty()) throw Error(path_ + ": corrupt trace file (truncated block)", ExitCode::bad_input);
        return false;
    }
    std::string bytes = std::move(carry_);
    carry_.clear();
    auto read_more = [&](std::uint64_t want) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(want, end_ - at_));
        const std::size_t from = bytes.size();
        bytes.resize(from + n);
        read_exactly(fd_, bytes.data() + from, n, at_, path_);
        at_ += n;
    };
    read_more(kChunk);
    std::size_t used = 0;
    while (bytes.size() - used >= kBlockHead) {
        std::uint32_t tid, words;
        std::uint64_t tsc;
        std::memcpy(&tid, bytes.data() + used, 4);
        std::memcpy(&words, bytes.data() + used + 4, 4);
        std::memcpy(&tsc, bytes.data() + used + 8, 8);
        const std::uint64_t length = kBlockHead + 8ull * words;
        if (words == 0 || length > kMaxBlock) throw Error(path_ + ": corrupt trace file (block size)", ExitCode::bad_input);
        if (bytes.size() - used < length) {
            if (used > 0 || at_ >= end_) break;  // the rest in the next call; at the end: truncated
            read_more(length - bytes.size());
            continue;
        }
        const char* word = bytes.data() + used + kBlockHead;
        const char* const end = word + 8ull * words;
        while (word < end) {
            std::uint64_t w;
            std::memcpy(&w, word, 8);
            word += 8;
            Event e;
            e.tid = tid;
            if ((w & 3) != kEscape) {
                tsc += w >> 24;
                e.kind = kind_of(static_cast<std::uint8_t>(w & 3), path_);
                e.probe = static_cast<std::uint32_t>(w >> 2) & (kProbeLimit - 1);
            } else {
                const std::size_t n = (w >> 2) & 0xff;
                if (n < 1 || n > 2 || static_cast<std::size_t>(end - word) < n * sizeof(iprobe_rt_record))
                    throw Error(path_ + ": corrupt trace file (escaped record)", ExitCode::bad_input);
                iprobe_rt_record r;
                std::memcpy(&r, word, sizeof r);
                if (r.kind < IPROBE_RT_REC_ENTRY || r.kind > IPROBE_RT_REC_POINT)
                    throw Error(path_ + ": corrupt trace file (event kind " + std::to_string(r.kind) + ")",
                                ExitCode::bad_input);
                tsc = r.tsc;
                e.kind = kind_of(static_cast<std::uint8_t>(r.kind - IPROBE_RT_REC_ENTRY), path_);
                e.probe = r.probe;
                e.depth = r.depth;
                e.frame = r.frame;
                e.inlined_copy = r.kind == IPROBE_RT_REC_ENTRY && (r.values & IPROBE_RT_VALUES_COPY);
                if (n == 2) {
                    e.nargs = 4;
                    std::memcpy(e.args, word + sizeof r, sizeof e.args);
                }
                word += n * sizeof r;
            }
            e.tsc = tsc;
            e.time_ns = clock_.ns(tsc);
            sink(e);
        }
        used += length;
    }
    carry_ = bytes.substr(used);
    return true;
}

}  // namespace iprobe::hotpatch
