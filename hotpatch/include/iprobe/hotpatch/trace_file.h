// The compact binary file `iprobe trace --output FILE` writes and
// `iprobe trace --input FILE --format text|json|chrome` converts.
//
//   header   "IPRBTRC1", u32 version, u32 pid, u64 reserved
//   events   per event: u64 time_ns (CLOCK_REALTIME), u32 probe, u32 tid,
//            u8 kind (entry 0, exit 1, point 2), u8 nargs, u16 depth,
//            then nargs u64 arguments                       (20 bytes + args)
//   probes   u32 count, per probe: u8 kind, u16 name length, name bytes
//   footer   u64 offset of the probe table, "IPRBEND1"
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
    TraceFileWriter(const std::string& path, pid_t pid);  // throws Error
    ~TraceFileWriter();
    TraceFileWriter(const TraceFileWriter&) = delete;
    TraceFileWriter& operator=(const TraceFileWriter&) = delete;

    void write(const Event& event);
    // Raw records as drained (TraceReader::drain_runs), converted in bulk;
    // a POINT's argument record may come in the next run of its ring.  An
    // ENTRY's or EXIT's values (continuation records) are not kept: passed
    // over and counted (without_values()).
    void write(const RecordRun& run, const WallClock& clock);
    // After the last run: a point still waiting for its arguments is
    // written without them.
    void end_of_stream();
    // Writes the probe names (index = global probe index) and the footer.
    void finish(const std::vector<ProbeInfo>& probes);
    std::uint64_t events() const { return events_; }
    // Events written whose arguments, return value or backtrace the file
    // does not keep (attach --args/--retval/--backtrace).
    std::uint64_t without_values() const { return without_values_; }

private:
    std::string path_;
    std::FILE* file_ = nullptr;
    std::uint64_t events_ = 0;
    std::uint64_t without_values_ = 0;
    std::vector<char> buffer_;     // events not yet handed to file_
    std::size_t used_ = 0;
    bool args_next_ = false;       // the last record was a POINT whose arguments follow
    std::uint32_t values_next_ = 0;  // continuation records of the last ENTRY/EXIT still to pass over
    std::uint32_t ring_ = UINT32_MAX;
    std::uint64_t next_at_ = 0;      // where the last run of ring_ ended
    void flush_buffer();
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
    // Hands the next chunk's events (at most 1 MiB of the file) to `sink`;
    // false once every event was read.
    bool next(const std::function<void(const Event&)>& sink);

private:
    std::string path_;
    int fd_ = -1;
    pid_t pid_ = 0;
    std::vector<ProbeInfo> probes_;
    std::uint64_t at_ = 0, end_ = 0;  // events: [at_, end_) still to read
    std::string carry_;               // an event cut by the previous chunk's end
};

}  // namespace iprobe::hotpatch
