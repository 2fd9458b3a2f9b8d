// The compact binary file `iprobe trace --output FILE` writes and
// `iprobe trace --input FILE --format text|json|chrome` converts.  The
// writer encodes the rings' records straight into its output buffer (one
// pass, one copy, no clock conversion: the header keeps the clock) and
// hands it to write(2) a MiB at a time; the conversion decodes later.
//
// Version 6 (written; version 5, the same without exits recorded without
// a time, version 4, without exit marks too, version 3, without GAP records
// too, and version 2, without values events and the types table too, are
// read; any other is refused, naming the versions read):
//   header   "IPRBTRC1", u32 version 5, u32 pid, u64 tsc_base,
//            u64 realtime_base_ns, f64 ns_per_tick                   (40 bytes)
//   blocks   one thread's events in order: u32 tid, u32 words, u64 base_tsc,
//            then `words` u64 words, each
//              an event   bits 0-1 kind (0 entry, 1 exit, 2 point without
//                         arguments; at an entry probe: an entry whose
//                         call's exit is not traced, attach --entry-only),
//                         bits 2-23 the global probe index,
//                         bits 24-63 ticks since the block's previous event
//                         (base_tsc for the first); 2^40 - 1 in an exit: it
//                         has no time (attach --no-durations), and the
//                         block's clock stays where it was          (8 bytes)
//              an escape  bits 0-1 = 3, bits 2-9 = n > 0: n raw 32-byte ring
//                         records follow (struct iprobe_rt_record, then a
//                         point's argument record); for what a word cannot
//                         hold: a point's arguments, a nested handler
//                         (depth > 0), a probe index >= 2^22, a clock step
//                         back or >= 2^40 - 1 ticks (an exit's tsc
//                         IPROBE_RT_NO_TIME: no time, as above); and a GAP record (n = 1,
//                         not an event: its thread's next event comes after
//                         `frame` events the ring dropped; its tsc, unless
//                         IPROBE_RT_NO_TIME, becomes the block's previous
//                         one); and an exit mark
//                         (IPROBE_RT_REC_EXITS_LOST, n = 1, in a block of
//                         its own: not an event, the block's clock goes on;
//                         its `tid`'s first event at or after its tsc comes
//                         after `frame` calls of the function of exit probe
//                         `probe` lost their exits at a detach,
//                         exit_marks.h).
//              a values   an ENTRY or EXIT the values path recorded
//              event      (attach --args/--retval/--backtrace/--when; a
//                         record with a values spec, words or none; spec
//                         flag IPROBE_RT_VALUES_NO_EXIT: an entry whose
//                         exit is not traced;
//                         iprobe_rt_record.values, .frame): bits 0-1 = 3,
//                         bits 2-9 = 0, bits 10-11 kind (0 entry, 1 exit),
//                         bits 12-19 its continuation records (as many as
//                         the reader got), bits 20-30 w, bit 31 a frame word
//                         follows, bits 32-63 the packed spec; then u32
//                         probe | u16 depth << 32, the ticks since the
//                         block's previous event (mod 2^64), the frame (bit
//                         31), and the records' first w words (the rest of
//                         them, up to 4 a record, are 0).   (24-32 bytes + 8w)
//   probes   u32 count, per probe: u8 kind, u16 name length, name bytes
//   types    what typing the values events takes, as the live reader had
//            it (values_reader.h, ValueTypes): u32 count, per probe with
//            values: u32 probe, u32 its entry's distance, u64 site; u32
//            count, per function: u32 entry probe, its parameters and
//            return value (names, C types with struct members and enum
//            labels, registers); u32 count, per backtrace address: u64
//            address, function, file, u32 line.  Strings: u32 length, bytes.
//   footer   u64 offset of the probe table, "IPRBEND1"
// Little-endian, packed.  A file cut short (no footer) is refused.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe::hotpatch {

inline constexpr std::uint32_t kTraceFileVersion = 6;

class TraceFileWriter {
public:
    // `clock`: the region's (TraceReader::wall_clock()), kept in the header.
    // `types` (TraceReader::value_types()) types values events as they
    // come, so the file keeps what converting them takes; without it they
    // are kept untyped (converted without values).
    TraceFileWriter(const std::string& path, pid_t pid, const WallClock& clock, ValueTypes* types = nullptr);  // throws Error
    ~TraceFileWriter();
    TraceFileWriter(const TraceFileWriter&) = delete;
    TraceFileWriter& operator=(const TraceFileWriter&) = delete;

    // Raw records as drained (TraceReader::drain_runs), encoded in one
    // pass; a POINT's argument record, an ENTRY's or EXIT's values, may
    // come in the next run of its ring (as TraceReader::decode reads them).
    void write(const RecordRun& run);
    // An exit mark (TraceReader::drain_runs' `marks`), before the runs it
    // comes before.
    void mark(const ExitMark& mark);
    // Writes the probe names (index = global probe index), the types and
    // the footer.
    void finish(const std::vector<ProbeInfo>& probes);
    std::uint64_t events() const { return events_; }
    std::uint64_t bytes() const { return written_ + used_; }  // so far, header included
    // Values events (attach --args/--retval/--backtrace/--when) among
    // events(), and their bytes.
    std::uint64_t values_events() const { return values_events_; }
    std::uint64_t values_bytes() const { return values_bytes_; }

private:
    static constexpr std::size_t kNoBlock = SIZE_MAX;
    std::string path_;
    int fd_ = -1;
    std::uint64_t events_ = 0;
    std::uint64_t values_events_ = 0, values_bytes_ = 0;
    std::uint64_t written_ = 0;      // bytes handed to the file
    std::vector<char> buffer_;       // bytes not yet handed to the file
    std::size_t used_ = 0;
    std::size_t block_ = kNoBlock;   // the open block's header in buffer_
    std::uint32_t block_tid_ = 0;
    std::uint64_t previous_tsc_ = 0; // the open block's last event
    std::size_t point_ = kNoBlock;   // an escaped POINT whose argument record is still to come
    std::size_t values_ = kNoBlock;  // a values event whose continuation records are still to come
    std::size_t values_words_ = 0;   // where its words start in buffer_
    std::uint32_t values_left_ = 0;  // its continuation records still to come
    std::uint32_t values_got_ = 0;   // and those that came
    ValueTypes* types_ = nullptr;
    struct Types;                    // what the values events written so far are typed with
    std::unique_ptr<Types> types_kept_;
    std::uint32_t ring_ = UINT32_MAX;
    std::uint64_t next_at_ = 0;      // where the last run of ring_ ended
    void open_block(std::uint32_t tid, std::uint64_t tsc);
    void close_block();
    void end_point();                // the pending POINT without its arguments
    void end_values();               // the pending values event with the words it got
    void keep_types(std::uint32_t probe, bool exit, std::uint32_t spec, const std::uint64_t* words, std::size_t count,
                    std::size_t all);
    void flush();
    void write_out(const char* data, std::size_t size);
};

// Reads a trace file in bounded pieces: whatever its size, memory holds
// the probe table and one chunk of events.  The constructor checks the file
// before reading anything: a regular file (no FIFO, device or directory:
// Error(bad_input), one line), within the size limits, header, footer and
// probe table sound.  Throws Error(bad_input) on anything malformed.
class TraceFileReader {
public:
    explicit TraceFileReader(const std::string& path);
    ~TraceFileReader();
    TraceFileReader(const TraceFileReader&) = delete;
    TraceFileReader& operator=(const TraceFileReader&) = delete;

    pid_t pid() const { return pid_; }
    const std::vector<ProbeInfo>& probes() const { return probes_; }
    // Hands the next chunk's events (at most 1 MiB of the file, or one
    // block) to `sink`; false once every event was read.
    bool next(const std::function<void(const Event&)>& sink);
    // Calls of the exit marks read that no event came after (yet).
    std::uint64_t exit_marks_waiting() const { return marks_.calls(); }

private:
    std::string path_;
    int fd_ = -1;
    pid_t pid_ = 0;
    std::uint32_t version_ = 0;
    PendingGap gap_;              // owned by a thread
    PendingExitMarks marks_;      // read, not yet given to an event
    std::vector<ProbeInfo> probes_;
    WallClock clock_;
    std::uint64_t at_ = 0, end_ = 0;  // events: [at_, end_) still to read
    std::string carry_;               // a block cut by the previous chunk's end
    class Types;                      // the file's types table
    std::unique_ptr<Types> types_;
};

}  // namespace iprobe::hotpatch
