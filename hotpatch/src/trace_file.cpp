#include "iprobe/hotpatch/trace_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <map>
#include <unordered_map>
#include <utility>

#include "iprobe/support/error.h"
#include "iprobe/support/file.h"
#include "values_reader.h"

namespace iprobe::hotpatch {

namespace {

constexpr char kMagic[8] = {'I', 'P', 'R', 'B', 'T', 'R', 'C', '1'};
constexpr char kEnd[8] = {'I', 'P', 'R', 'B', 'E', 'N', 'D', '1'};
constexpr std::uint32_t kVersion = kTraceFileVersion;
constexpr std::uint32_t kOldestVersion = 2;  // read too: its events are version 3's without values
constexpr std::uint32_t kValuesVersion = 3;  // the first with values events
constexpr std::uint32_t kGapsVersion = 4;    // the first with GAP records (where a ring dropped events)
constexpr std::uint32_t kExitMarksVersion = 5;  // the first with exit marks (where a detach lost exits)
constexpr std::uint32_t kUnstampedVersion = 6;  // the first with exits without a time (kUnstamped)
constexpr std::size_t kMinHeader = 16, kHeader = 40, kFooter = 16, kBlockHead = 16;
constexpr std::uint64_t kEscape = 3, kProbeLimit = 1u << 22, kDeltaLimit = 1ull << 40;
// An exit word's ticks that say it has no time (attach --no-durations): the
// block's clock stays; any real delta from it up is escaped.
constexpr std::uint64_t kUnstamped = kDeltaLimit - 1;
// A values event's head word: what a raw escape (n > 0) never is.
constexpr std::uint64_t kValuesFrame = 1ull << 31;
constexpr std::uint32_t kValuesMaxWords = (1u << 11) - 1;
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
    std::string string32() { return string(get<std::uint32_t>()); }
    // A count of items at least `each` bytes long: never more than the bytes left.
    std::uint32_t count(std::size_t each) {
        const auto n = get<std::uint32_t>();
        if (n > (end_ - at_) / each) throw Error(path_ + ": corrupt trace file (a count of " + std::to_string(n) + ")", ExitCode::bad_input);
        return n;
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

void put_string(std::string& out, const std::string& v) {
    put(out, static_cast<std::uint32_t>(v.size()));
    out += v;
}

void put_type(std::string& out, const elf::ValueType& t) {
    put_string(out, t.name);
    put(out, static_cast<std::uint8_t>(t.cls));
    put(out, t.size);
    put(out, static_cast<std::uint32_t>(t.enumerators.size()));
    for (const auto& [value, label] : t.enumerators) {
        put(out, value);
        put_string(out, label);
    }
    put(out, static_cast<std::uint32_t>(t.members.size()));
    for (const auto& m : t.members) {
        put_string(out, m.name);
        put(out, m.offset);
        put_type(out, m.type ? *m.type : elf::ValueType{});
    }
}

// What decode_values() reads of a slot: its name, type, registers,
// constant, and whether it is found at a -finstrument-functions site.
void put_slot(std::string& out, const elf::ValueSlot& v) {
    put_string(out, v.name);
    put_type(out, v.type);
    put(out, static_cast<std::uint8_t>(std::min<std::size_t>(v.parts.size(), 255)));
    for (std::size_t i = 0; i < v.parts.size() && i < 255; i++) {
        put(out, static_cast<std::uint8_t>(v.parts[i].vector));
        put(out, v.parts[i].reg);
    }
    put(out, static_cast<std::uint8_t>(v.constant.has_value()));
    if (v.constant) put(out, *v.constant);
    put(out, static_cast<std::uint8_t>(!v.at_site.empty()));
}

enum : std::uint8_t { kTyped = 1, kAtSite = 2, kInlined = 4, kReturns = 8 };

void put_function(std::string& out, const elf::FunctionValues& f) {
    put(out, static_cast<std::uint8_t>((f.typed ? kTyped : 0) | (f.at_site ? kAtSite : 0) | (f.inlined ? kInlined : 0) |
                                       (f.ret ? kReturns : 0)));
    put(out, static_cast<std::uint32_t>(f.params.size()));
    for (const auto& p : f.params) put_slot(out, p);
    if (f.ret) put_slot(out, *f.ret);
}

// Types nest (a struct's members) as deep as a file says: bounded.
constexpr int kMaxTypeDepth = 64;  // the DWARF reader's own bound is 24 (elf/src/dwarf_types.h)

elf::ValueType get_type(Cursor& in, const std::string& path, int depth = 0) {
    if (depth > kMaxTypeDepth) throw Error(path + ": corrupt trace file (types nested too deep)", ExitCode::bad_input);
    elf::ValueType t;
    t.name = in.string32();
    const auto cls = in.get<std::uint8_t>();
    if (cls > static_cast<std::uint8_t>(elf::ValueClass::other))
        throw Error(path + ": corrupt trace file (value class " + std::to_string(cls) + ")", ExitCode::bad_input);
    t.cls = static_cast<elf::ValueClass>(cls);
    t.size = in.get<std::uint32_t>();
    for (std::uint32_t n = in.count(12); n > 0; n--) {
        const auto value = in.get<std::int64_t>();
        t.enumerators.emplace_back(value, in.string32());
    }
    for (std::uint32_t n = in.count(13); n > 0; n--) {
        elf::ValueType::Member m;
        m.name = in.string32();
        m.offset = in.get<std::uint32_t>();
        m.type = std::make_shared<const elf::ValueType>(get_type(in, path, depth + 1));
        t.members.push_back(std::move(m));
    }
    return t;
}

elf::ValueSlot get_slot(Cursor& in, const std::string& path) {
    elf::ValueSlot v;
    v.name = in.string32();
    v.type = get_type(in, path);
    for (std::uint8_t n = in.get<std::uint8_t>(); n > 0; n--) {
        elf::ValuePart part;
        part.vector = in.get<std::uint8_t>() != 0;
        part.reg = in.get<std::uint8_t>();
        // the registers the runtime captures (a return's: rax, rdx; xmm0, xmm1)
        if (part.reg >= (part.vector ? IPROBE_RT_VALUES_XMMS : IPROBE_RT_VALUES_GPRS))
            throw Error(path + ": corrupt trace file (register " + std::to_string(part.reg) + ")", ExitCode::bad_input);
        v.parts.push_back(part);
    }
    if (in.get<std::uint8_t>()) v.constant = in.get<std::int64_t>();
    if (in.get<std::uint8_t>()) v.at_site.resize(v.parts.size());
    return v;
}

elf::FunctionValues get_function(Cursor& in, const std::string& path) {
    elf::FunctionValues f;
    const auto flags = in.get<std::uint8_t>();
    f.typed = flags & kTyped;
    f.at_site = flags & kAtSite;
    f.inlined = flags & kInlined;
    for (std::uint32_t n = in.count(16); n > 0; n--) f.params.push_back(get_slot(in, path));
    if (flags & kReturns) f.ret = get_slot(in, path);
    return f;
}

// The exit words (rax, rdx, xmm0, xmm1) decode_values() reads a return of
// `f` from, as bits.
std::uint8_t return_words(const elf::FunctionValues& f) {
    if (!f.ret) return 0;
    if (f.ret->parts.empty()) return 1;  // returned in memory: rax points at it
    std::uint8_t used = 0;
    for (std::size_t i = 0; i < f.ret->parts.size() && i < 2; i++)
        used |= static_cast<std::uint8_t>(1u << (f.ret->parts[i].vector ? 2 + (f.ret->parts[i].reg & 1) : f.ret->parts[i].reg & 1));
    return used;
}

// What a values event's probe is typed by beside its function: how far back
// its entry is (an exit's) and its site (an inlined copy's host).
struct ProbeTypes {
    std::uint32_t distance = 0;
    std::uint64_t site = 0;
};

// Where a values event's backtrace words start (values_reader.cpp's order).
std::size_t backtrace_at(std::uint32_t packed_spec) {
    const unsigned flags = packed_spec & 0xff;
    if (!(flags & IPROBE_RT_VALUES_ARGS)) return 0;
    const unsigned gprs = std::min<unsigned>(packed_spec >> 8 & 15, IPROBE_RT_VALUES_GPRS);
    const unsigned xmms = std::min<unsigned>(packed_spec >> 12 & 15, IPROBE_RT_VALUES_XMMS);
    const unsigned strings = packed_spec >> 16 & 0xff & ((1u << gprs) - 1);
    return gprs + xmms + static_cast<std::size_t>(__builtin_popcount(strings)) * (1 + IPROBE_RT_STRING_BYTES / 8);
}

}  // namespace

// What the values events written so far were typed with, as the live
// reader typed them; kept as they come (the process may be gone at finish).
struct TraceFileWriter::Types {
    std::vector<std::uint8_t> seen;  // by probe index (< the region's probe count)
    // By exit probe: the return words (rax, rdx, xmm0, xmm1) its function's
    // return value is read from; the others are never printed, so not kept.
    std::vector<std::uint8_t> return_words;
    std::map<std::uint32_t, ProbeTypes> probes;
    std::map<std::uint32_t, elf::FunctionValues> functions;  // by entry probe
    std::unordered_map<std::uint64_t, Frame> frames;         // backtrace addresses

    void keep_function(ValueTypes& types, std::uint32_t entry) {
        if (!functions.count(entry)) functions.emplace(entry, types.function(entry));
    }
    void keep_frame(ValueTypes& types, std::uint64_t address) {
        if (!frames.count(address)) frames.emplace(address, types.symbolize(address));
    }
    std::string table() const {
        std::string out;
        put(out, static_cast<std::uint32_t>(probes.size()));
        for (const auto& [probe, p] : probes) {
            put(out, probe);
            put(out, p.distance);
            put(out, p.site);
        }
        put(out, static_cast<std::uint32_t>(functions.size()));
        for (const auto& [probe, f] : functions) {
            put(out, probe);
            put_function(out, f);
        }
        put(out, static_cast<std::uint32_t>(frames.size()));
        for (const auto& [address, f] : frames) {
            put(out, address);
            put_string(out, f.function);
            put_string(out, f.file);
            put(out, f.line);
        }
        return out;
    }
};

// The file's types table, as ValueTypes: what decode_values() asks of it
// is what the live reader answered.
class TraceFileReader::Types final : public ValueTypes {
public:
    Types() = default;  // a version 2 file's: it has none (and no values events)
    Types(Cursor& in, const std::string& path) {
        for (std::uint32_t n = in.count(16); n > 0; n--) {
            const auto probe = in.get<std::uint32_t>();
            const auto distance = in.get<std::uint32_t>();
            probes_[probe] = {distance, in.get<std::uint64_t>()};
        }
        for (std::uint32_t n = in.count(5); n > 0; n--) {
            const auto probe = in.get<std::uint32_t>();
            functions_[probe] = get_function(in, path);
        }
        for (std::uint32_t n = in.count(20); n > 0; n--) {
            Frame f;
            f.address = in.get<std::uint64_t>();
            f.function = in.string32();
            f.file = in.string32();
            f.line = in.get<std::uint32_t>();
            frames_[f.address] = std::move(f);
        }
        if (!in.done()) throw Error(path + ": corrupt trace file (bytes after the types table)", ExitCode::bad_input);
    }
    bool knows(std::uint32_t probe) override { return probes_.count(probe) > 0; }
    std::uint32_t entry_distance(std::uint32_t exit_probe) override { return probes_.at(exit_probe).distance; }
    const elf::FunctionValues& function(std::uint32_t entry_probe) override {
        const auto it = functions_.find(entry_probe);
        return it != functions_.end() ? it->second : none_;
    }
    std::uint64_t site(std::uint32_t probe) override {
        const auto it = probes_.find(probe);
        return it != probes_.end() ? it->second.site : 0;
    }
    Frame symbolize(std::uint64_t address) override {
        const auto it = frames_.find(address);
        if (it != frames_.end()) return it->second;
        Frame f;
        f.address = address;
        return f;
    }

private:
    std::map<std::uint32_t, ProbeTypes> probes_;
    std::map<std::uint32_t, elf::FunctionValues> functions_;
    std::unordered_map<std::uint64_t, Frame> frames_;
    const elf::FunctionValues none_ = elf::raw_function_values();
};

TraceFileWriter::TraceFileWriter(const std::string& path, pid_t pid, const WallClock& clock, ValueTypes* types)
    : path_(path), types_(types), types_kept_(std::make_unique<Types>()) {
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
    end_values();
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

// The values event's records are all in (or no more will come): its words
// without the trailing zeros, their count in its head word.
void TraceFileWriter::end_values() {
    if (values_ == kNoBlock) return;
    char* const base = buffer_.data();
    std::size_t words = (used_ - values_words_) / 8;
    const auto* word = reinterpret_cast<const std::uint64_t*>(base + values_words_);
    std::uint64_t head;
    std::memcpy(&head, base + values_, 8);
    const auto spec = static_cast<std::uint32_t>(head >> 32);
    std::uint32_t probe;
    std::memcpy(&probe, base + values_ + 8, 4);
    const bool exit = (head >> 10 & 3) == 1;
    if (values_got_) keep_types(probe, exit, spec, word, words, 4u * values_got_);
    const auto& used = types_kept_->return_words;
    if (exit && types_ && probe < used.size())  // what its return is not read from: 0, and left out below
        for (std::size_t i = 0; i < 4 && i < words; i++)
            if (!(used[probe] >> i & 1)) std::memset(base + values_words_ + 8 * i, 0, 8);
    while (words > 0) {
        std::uint64_t last;
        std::memcpy(&last, base + values_words_ + 8 * (words - 1), 8);
        if (last) break;
        words--;
    }
    head |= std::uint64_t{values_got_} << 12 | std::uint64_t{words} << 20;
    std::memcpy(base + values_, &head, 8);
    used_ = values_words_ + 8 * words;
    values_bytes_ += used_ - values_;
    values_ = kNoBlock;
    values_left_ = 0;
}

// Keeps, at a probe's first values event (and a backtrace address's first
// sight), what the live reader types it with.  `words` of `all` (the rest 0).
void TraceFileWriter::keep_types(std::uint32_t probe, bool exit, std::uint32_t spec, const std::uint64_t* words,
                                 std::size_t count, std::size_t all) {
    if (!types_ || !types_->knows(probe)) return;
    Types& kept = *types_kept_;
    if (probe >= kept.seen.size()) kept.seen.resize(std::size_t{probe} + 1, 0);
    if (!kept.seen[probe]) {
        kept.seen[probe] = 1;
        const std::uint32_t distance = types_->entry_distance(probe);
        kept.probes[probe] = {distance, types_->site(probe)};
        if (!exit) kept.keep_function(*types_, probe);
        else if (probe >= distance) kept.keep_function(*types_, probe - distance);
        if (exit) {
            if (probe >= kept.return_words.size()) kept.return_words.resize(std::size_t{probe} + 1, 0xf);
            kept.return_words[probe] = probe >= distance ? return_words(kept.functions.at(probe - distance)) : 0;
        }
        if (!exit && kept.functions.at(probe).inlined) kept.keep_frame(*types_, types_->site(probe) + 1);
    }
    if (exit || !(spec & IPROBE_RT_VALUES_BACKTRACE)) return;
    auto word = [&](std::size_t i) { return i < count ? words[i] : 0; };
    std::size_t at = backtrace_at(spec);
    const std::uint64_t n = std::min<std::uint64_t>(word(at++), IPROBE_RT_BACKTRACE_MAX);
    for (std::uint64_t i = 0; i < n && at < all; i++) kept.keep_frame(*types_, word(at++));
}

void TraceFileWriter::write(const RecordRun& run) {
    if (run.ring != ring_ || run.from != next_at_) close_block();  // another ring, or a page of it skipped
    ring_ = run.ring;
    next_at_ = run.to;
    // A block is written whole, so never flushed while a point waits for
    // its argument record; the buffer's slack holds one run at 5 words a
    // record (an escape), and grows for a longer run.
    if (used_ >= kFlushAt && point_ == kNoBlock && values_ == kNoBlock) flush();
    const std::size_t most = used_ + (run.to - run.from) * (kBlockHead + 40);  // a block and an escape each, at most
    if (most > buffer_.size()) buffer_.resize(most);
    char* const base = buffer_.data();
    char* out = base + used_;
    std::uint64_t previous = previous_tsc_;
    for (std::uint64_t at = run.from; at < run.to; at++) {
        const iprobe_rt_record& r = run.records[at & run.mask];
        // The target's core wrote these lines: ask for them well ahead.
        __builtin_prefetch(&run.records[(at + kPrefetchAhead) & run.mask]);
        if (values_ != kNoBlock) {  // the values event's words
            std::memcpy(out, &r, sizeof r);
            out += sizeof r;
            values_got_++;
            if (--values_left_ == 0) {
                used_ = static_cast<std::size_t>(out - base);
                end_values();
                out = base + used_;
            }
            continue;
        }
        if (point_ != kNoBlock) {  // the POINT's argument record, its head already written
            std::memcpy(out, &r, sizeof r);
            out += sizeof r;
            point_ = kNoBlock;
            continue;
        }
        // an exit recorded without its time (or a GAP before one): the clock stays where it was
        const bool stamped = r.tsc != IPROBE_RT_NO_TIME;
        if (block_ == kNoBlock || r.tid != block_tid_) {
            used_ = static_cast<std::size_t>(out - base);
            open_block(r.tid, stamped ? r.tsc : previous);
            out = base + used_;
            if (stamped) previous = r.tsc;
        }
        const std::uint64_t delta = r.tsc - previous;
        if (r.kind == IPROBE_RT_REC_GAP) [[unlikely]] {  // where the ring dropped events: kept raw, no event
            const std::uint64_t escape = kEscape | 1u << 2;
            std::memcpy(out, &escape, 8);
            std::memcpy(out + 8, &r, sizeof r);
            out += 8 + sizeof r;
            if (stamped) previous = r.tsc;
            continue;
        }
        const std::uint32_t kind = r.kind - 1u;  // entry 0, exit 1, point 2
        // (a record with a values spec keeps it, words or not: its flags say how it nests)
        if (kind < 3 && (r.nargs | r.depth | r.values) == 0 && r.probe < kProbeLimit &&
            (stamped ? delta < kUnstamped : kind == 1)) [[likely]] {
            const std::uint64_t word = kind | std::uint64_t{r.probe} << 2 | (stamped ? delta : kUnstamped) << 24;
            std::memcpy(out, &word, 8);
            out += 8;
            if (stamped) previous = r.tsc;
            events_++;
            continue;
        }
        if (kind >= 3) continue;  // a continuation record without its head: not an event
        if (kind < 2 && (r.nargs || r.values || r.frame)) {  // the values path's: a values event
            const std::uint64_t head = kEscape | std::uint64_t{kind} << 10 | (r.frame ? kValuesFrame : 0) |
                                       std::uint64_t{r.values} << 32;
            const std::uint64_t where = r.probe | std::uint64_t{r.depth} << 32;
            values_ = static_cast<std::size_t>(out - base);
            std::memcpy(out, &head, 8);
            std::memcpy(out + 8, &where, 8);
            std::memcpy(out + 16, &delta, 8);
            out += 24;
            if (r.frame) {
                std::memcpy(out, &r.frame, 8);
                out += 8;
            }
            values_words_ = static_cast<std::size_t>(out - base);
            values_left_ = std::min<std::uint32_t>(r.nargs, kValuesMaxWords / 4);
            values_got_ = 0;
            previous = r.tsc;
            events_++;
            values_events_++;
            if (!values_left_) {
                used_ = static_cast<std::size_t>(out - base);
                end_values();
                out = base + used_;
            }
            continue;
        }
        const bool point_args = r.kind == IPROBE_RT_REC_POINT && r.nargs;
        const std::uint64_t escape = kEscape | (point_args ? 2u : 1u) << 2;
        std::memcpy(out, &escape, 8);
        if (point_args) point_ = static_cast<std::size_t>(out - base);
        std::memcpy(out + 8, &r, sizeof r);
        out += 8 + sizeof r;
        if (stamped) previous = r.tsc;
        events_++;
    }
    used_ = static_cast<std::size_t>(out - base);
    previous_tsc_ = previous;
    if (run.last) {  // cut by what the ring had published: as the live reader takes it (TraceReader::decode)
        end_point();
        end_values();
    }
}

// A block of its own holding the mark as a raw record (its thread's next
// run starts a block again).
void TraceFileWriter::mark(const ExitMark& m) {
    close_block();
    if (used_ + 2 * kBlockHead + 40 > buffer_.size()) buffer_.resize(used_ + 2 * kBlockHead + 40);
    open_block(m.tid, m.at);
    iprobe_rt_record r{};
    r.tsc = m.at;
    r.probe = m.probe;
    r.tid = m.tid;
    r.kind = IPROBE_RT_REC_EXITS_LOST;
    r.frame = m.count;
    const std::uint64_t escape = kEscape | 1u << 2;
    std::memcpy(buffer_.data() + used_, &escape, 8);
    std::memcpy(buffer_.data() + used_ + 8, &r, sizeof r);
    used_ += 8 + sizeof r;
    close_block();
    ring_ = UINT32_MAX;
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
    table += types_kept_->table();
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
    if (size < kMinHeader + kFooter ||
        (read_exactly(fd_, head, kMinHeader, 0, path), std::memcmp(head, kMagic, sizeof kMagic) != 0))
        throw Error(path + " is not an iprobe trace file (written by 'iprobe trace --output')", ExitCode::bad_input);
    std::uint32_t version;
    std::memcpy(&version, head + sizeof kMagic, 4);
    if (version < kOldestVersion || version > kVersion)
        throw Error(path + ": trace file version " + std::to_string(version) + ", but this iprobe reads versions " +
                        std::to_string(kOldestVersion) + " to " + std::to_string(kVersion) + " (written by " +
                        (version < kVersion ? "an older" : "a newer") + " iprobe: convert it with that one)",
                    ExitCode::bad_input);
    version_ = version;
    char foot[kFooter];
    read_exactly(fd_, foot, sizeof foot, size - kFooter, path);
    if (std::memcmp(foot + 8, kEnd, sizeof kEnd) != 0)
        throw Error(path + ": the trace file ends early (the trace was killed before it finished)", ExitCode::bad_input);
    if (size < kHeader + kFooter) throw Error(path + ": corrupt trace file (header)", ExitCode::bad_input);
    read_exactly(fd_, head, kHeader, 0, path);
    const std::string head_bytes(head, kHeader);
    Cursor header(head_bytes, sizeof kMagic + 4, kHeader, path);
    pid_ = static_cast<pid_t>(header.get<std::uint32_t>());
    clock_.tsc_base = header.get<std::uint64_t>();
    clock_.realtime_base = header.get<std::uint64_t>();
    clock_.ns_per_tick = header.get<double>();
    if (!(clock_.ns_per_tick > 0 && clock_.ns_per_tick < 1e6))
        throw Error(path + ": corrupt trace file (clock)", ExitCode::bad_input);
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
    const std::uint32_t count = table.count(3);
    probes_.reserve(count);
    for (std::uint32_t i = 0; i < count; i++) {
        ProbeInfo p;
        p.kind = kind_of(table.get<std::uint8_t>(), path);
        p.function = table.string(table.get<std::uint16_t>());
        probes_.push_back(std::move(p));
    }
    // Version 2 is version 3 without values: no types table, no values events.
    types_ = version == kOldestVersion ? std::make_unique<Types>() : std::make_unique<Types>(table, path);
    at_ = kHeader;
    end_ = table_at;
}

TraceFileReader::~TraceFileReader() {
    if (fd_ >= 0) ::close(fd_);
}

// A block at a time (the writer keeps them near 1 MiB): the chunk read
// grows to hold the block it cuts.
bool TraceFileReader::next(const std::function<void(const Event&)>& sink) {
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
        std::vector<std::uint64_t> values;  // a values event's words, as the ring had them
        while (word < end) {
            std::uint64_t w;
            std::memcpy(&w, word, 8);
            word += 8;
            Event e;
            e.tid = tid;
            if ((w & 3) != kEscape) {
                e.kind = kind_of(static_cast<std::uint8_t>(w & 3), path_);
                if (w >> 24 == kUnstamped && e.kind == probelist::ProbeKind::exit && version_ >= kUnstampedVersion)
                    e.stamped = false;
                else
                    tsc += w >> 24;
                e.probe = static_cast<std::uint32_t>(w >> 2) & (kProbeLimit - 1);
                if (e.probe < probes_.size()) entry_without_exit(e, probes_[e.probe].kind, 0);
            } else if ((w >> 2 & 0xff) == 0) {  // a values event
                if (version_ < kValuesVersion) throw Error(path_ + ": corrupt trace file (a values event in a version " +
                                                         std::to_string(version_) + " file)",
                                                     ExitCode::bad_input);
                const std::size_t head = w & kValuesFrame ? 3 : 2, kept = w >> 20 & kValuesMaxWords;
                const std::size_t records = w >> 12 & 0xff;
                if (static_cast<std::size_t>(end - word) / 8 < head + kept || kept > 4 * records || (w >> 10 & 3) > 1)
                    throw Error(path_ + ": corrupt trace file (values event)", ExitCode::bad_input);
                std::uint64_t where, delta;
                std::memcpy(&where, word, 8);
                std::memcpy(&delta, word + 8, 8);
                if (head == 3) std::memcpy(&e.frame, word + 16, 8);
                word += 8 * head;
                tsc += delta;
                const auto spec = static_cast<std::uint32_t>(w >> 32);
                e.kind = (w >> 10 & 3) == 0 ? probelist::ProbeKind::entry : probelist::ProbeKind::exit;
                e.probe = static_cast<std::uint32_t>(where);
                e.depth = static_cast<std::uint16_t>(where >> 32);
                e.inlined_copy = e.kind == probelist::ProbeKind::entry && (spec & IPROBE_RT_VALUES_COPY);
                entry_without_exit(e, probelist::ProbeKind::entry, spec);
                if (records) {
                    values.assign(4 * records, 0);
                    std::memcpy(values.data(), word, 8 * kept);
                    decode_values(e, spec, values, *types_);
                }
                word += 8 * kept;
            } else {
                const std::size_t n = (w >> 2) & 0xff;
                if (n < 1 || n > 2 || static_cast<std::size_t>(end - word) < n * sizeof(iprobe_rt_record))
                    throw Error(path_ + ": corrupt trace file (escaped record)", ExitCode::bad_input);
                iprobe_rt_record r;
                std::memcpy(&r, word, sizeof r);
                if (r.kind == IPROBE_RT_REC_GAP && n == 1 && version_ >= kGapsVersion) {
                    gap_.add(tid, r.frame);
                    if (r.tsc != IPROBE_RT_NO_TIME || version_ < kUnstampedVersion) tsc = r.tsc;
                    word += sizeof r;
                    continue;
                }
                if (r.kind == IPROBE_RT_REC_EXITS_LOST && n == 1 && version_ >= kExitMarksVersion) {
                    marks_.add({r.tid, r.probe, r.tsc, r.frame});  // no event: the block's clock goes on
                    word += sizeof r;
                    continue;
                }
                if (r.kind < IPROBE_RT_REC_ENTRY || r.kind > IPROBE_RT_REC_POINT)
                    throw Error(path_ + ": corrupt trace file (event kind " + std::to_string(r.kind) + ")",
                                ExitCode::bad_input);
                e.kind = kind_of(static_cast<std::uint8_t>(r.kind - IPROBE_RT_REC_ENTRY), path_);
                if (exit_without_time(r) && version_ >= kUnstampedVersion)
                    e.stamped = false;
                else
                    tsc = r.tsc;
                e.probe = r.probe;
                e.depth = r.depth;
                e.frame = r.frame;
                e.inlined_copy = r.kind == IPROBE_RT_REC_ENTRY && (r.values & IPROBE_RT_VALUES_COPY);
                if (e.probe < probes_.size()) entry_without_exit(e, probes_[e.probe].kind, r.values);
                if (n == 2) {
                    e.nargs = 4;
                    std::memcpy(e.args, word + sizeof r, sizeof e.args);
                }
                word += n * sizeof r;
            }
            if (e.stamped) {
                e.tsc = tsc;
                e.time_ns = clock_.ns(tsc);
            }
            e.dropped_before = gap_.take(tid);
            if (!marks_.empty() && e.stamped) [[unlikely]]
                for (const ExitMark& m : marks_.take(tid, tsc))
                    e.exits_lost_before.push_back(
                        {m.probe < probes_.size() ? probes_[m.probe].function : std::string(), m.count, clock_.ns(m.at)});
            sink(e);
        }
        used += length;
    }
    carry_ = bytes.substr(used);
    return true;
}

}  // namespace iprobe::hotpatch
