// Recorded traffic: the client->server byte stream of every connection and
// production's replies, with timestamps, zstd-compressed, so a fresh copy of
// the service can be fed the same input later (`iprobe replay`) and its
// replies compared with production's.
//
// File: the line "iprobe-recording 2\n", then one zstd stream of records
//   u8 kind (1 open, 2 data, 3 close, 4 reply) | u8[3] 0 | u32 connection | u64 ns since start | u32 length | bytes
// little-endian.  Version 1 files (no replies) are read too.  A recording cut
// short (crash, full queue) ends early but every record in it is whole.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace iprobe::proxy {

// data: client to server; reply: server to client.
enum class RecordKind : std::uint8_t { open = 1, data = 2, close = 3, reply = 4 };

struct Record {
    RecordKind kind;
    std::uint32_t connection;
    std::uint64_t t_ns;
    std::string bytes;
};

// Compression and disk writes run on a thread of their own: the proxy only
// queues.  If the disk cannot keep up and the queue passes `max_queued`
// bytes, the recording stops (counted, reported) rather than slow production.
class Recorder {
public:
    Recorder(const std::string& path, std::size_t max_queued);  // throws Error
    ~Recorder();
    Recorder(const Recorder&) = delete;
    Recorder& operator=(const Recorder&) = delete;

    void add(RecordKind kind, std::uint32_t connection, std::uint64_t t_ns, const void* data = nullptr,
             std::size_t size = 0);
    void finish();  // flush and close; idempotent

    bool stopped_early() const { return stopped_early_; }
    std::uint64_t records() const { return records_; }
    std::uint64_t bytes() const { return bytes_; }  // uncompressed, queued so far
    const std::string& path() const { return path_; }

private:
    void writer_loop();

    std::string path_;
    std::size_t max_queued_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::string queue_;       // encoded records waiting for the writer
    bool closing_ = false;
    std::atomic<bool> stopped_early_ = false;
    std::uint64_t records_ = 0;
    std::uint64_t bytes_ = 0;
    int fd_ = -1;
    std::string write_error_;
    std::thread writer_;
};

// Reads a whole recording; throws Error(bad_input) on a file that is not one.
std::vector<Record> read_recording(const std::string& path);

}  // namespace iprobe::proxy
