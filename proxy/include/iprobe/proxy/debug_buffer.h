// The bounded FIFO between a production stream and its debug copy.
//
// Appends are all-or-nothing: a stream is either forwarded to the debug copy
// complete or not at all from the overflow on, never with a hole in the
// middle (a hole would make the debug copy parse garbage and silently lie).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>

namespace iprobe::proxy {

class DebugBuffer {
public:
    explicit DebugBuffer(std::size_t capacity) : capacity_(capacity) {}

    // False (and nothing stored) when `size` more bytes would exceed capacity.
    bool append(const void* data, std::size_t size);
    // The oldest contiguous unconsumed bytes (empty when the buffer is).
    std::span<const std::uint8_t> front() const;
    void consume(std::size_t size);
    void clear();

    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    std::size_t capacity() const { return capacity_; }
    std::size_t high_water() const { return high_water_; }

private:
    static constexpr std::size_t kChunk = 16 * 1024;
    struct Chunk {
        std::uint8_t bytes[kChunk];
    };
    std::deque<std::unique_ptr<Chunk>> chunks_;
    std::size_t head_ = 0;  // read offset in chunks_.front()
    std::size_t tail_ = 0;  // write offset in chunks_.back()
    std::size_t size_ = 0;
    std::size_t capacity_;
    std::size_t high_water_ = 0;
};

}  // namespace iprobe::proxy
