// The compact binary file `iprobe trace --output FILE` writes and
// `iprobe trace --input FILE --format text|json|chrome` converts.  The
// writer encodes the rings' records straight into its output buffer (one
// pass, one copy, no clock conversion: the header keeps the clock) and
// hands it to write(2) a MiB at a time; the conversion decodes later.
//
// Version 2 (written):
//   header   "IPRBTRC1", u32 version 2, u32 pid, u64 tsc_base,
//            u64 realtime_base_ns, f64 ns_per_tick                   (40 bytes)
//   blocks   one thread's events in order: u32 tid, u32 words, u64 base_tsc,
//            then `words` u64 words, each
//              an event   bits 0-1 kind (0 entry, 1 exit, 2 point without
//                         arguments), bits 2-23 the global probe index,
//                         bits 24-63 ticks since the block's previous event
//                         (base_tsc for the first)                  (8 bytes)
//              an escape  bits 0-1 = 3, bits 2-9 = n: n raw 32-byte ring
//                         records follow (struct iprobe_rt_record, then a
//                         point's argument record); for what a word cannot
//                         hold: a point's arguments, a nested handler
//                         (depth > 0), a probe index >= 2^22, a clock step
//                         back or >= 2^40 ticks.  Its tsc becomes the
//                         block's previous one.
//   probes   u32 count, per probe: u8 kind, u16 name length, name bytes
//   footer   u64 offset of the probe table, "IPRBEND1"
// Version 1 (still read): header "IPRBTRC1", u32 1, u32 pid, u64 0; per
// event u64 time_ns, u32 probe, u32 tid, u8 kind, u8 nargs, u16 depth,
// nargs u64 arguments (20 bytes + arguments); probes and footer as above.
// Little-endian, packed.  A file cut short (no footer) is refused.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "iprobe/hotpatch/trace_reader.h"

namespace iprobe::hotpatch {

class TraceFileWriter {
public:
    // `clock`: the region's (TraceReader::wall_clock()), kept in the header.
    TraceFileWriter(const std::string& path, pid_t pid, const WallClock& clock);  // throws Error
    ~TraceFileWriter();
    TraceFileWriter(const TraceFileWriter&) = delete;
    TraceFileWriter& operator=(const TraceFileWriter&) = delete;

    // Raw records as drained (TraceReader::drain_runs), encoded in one
    // pass; a POINT's argument record may come in the next run of its
    // ring.  An ENTRY's or EXIT's values (continuation records) are not
    // kept: passed over and counted (without_values()).
    void write(const RecordRun& run);
    // Writes the probe names (index = global probe index) and the footer.
    void finish(const std::vector<ProbeInfo>& probes);
    std::uint64_t events() const { return events_; }
    std::uint64_t bytes() const { return written_ + used_; }  // so far, header included
    // Events written whose arguments, return value or backtrace the file
    // does not keep (attach --args/--retval/--backtrace).
    std::uint64_t without_values() const { return without_values_; }

private:
    static constexpr std::size_t kNoBlock = SIZE_MAX;
    std::string path_;
    int fd_ = -1;
    std::uint64_t events_ = 0;
    std::uint64_t without_values_ = 0;
    std::uint64_t written_ = 0;      // bytes handed to the file
    std::vector<char> buffer_;       // bytes not yet handed to the file
    std::size_t used_ = 0;
    std::size_t block_ = kNoBlock;   // the open block's header in buffer_
    std::uint32_t block_tid_ = 0;
    std::uint64_t previous_tsc_ = 0; // the open block's last event
    std::size_t point_ = kNoBlock;   // an escaped POINT whose argument record is still to come
    std::uint32_t values_left_ = 0;  // continuation records of the last ENTRY/EXIT to pass over
    std::uint32_t ring_ = UINT32_MAX;
    std::uint64_t next_at_ = 0;      // where the last run of ring_ ended
    void open_block(std::uint32_t tid, std::uint64_t tsc);
    void close_block();
    void end_point();                // the pending POINT without its arguments
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

private:
    std::string path_;
    int fd_ = -1;
    pid_t pid_ = 0;
    std::vector<ProbeInfo> probes_;
    std::uint32_t version_ = 0;
    WallClock clock_;                 // version 2
    std::uint64_t at_ = 0, end_ = 0;  // events: [at_, end_) still to read
    std::string carry_;               // an event (a block) cut by the previous chunk's end
    bool next_v1(const std::function<void(const Event&)>& sink);
    bool next_v2(const std::function<void(const Event&)>& sink);
};

}  // namespace iprobe::hotpatch
