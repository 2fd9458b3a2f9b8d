#include "iprobe/proxy/debug_buffer.h"

#include <algorithm>
#include <cstring>

namespace iprobe::proxy {

bool DebugBuffer::append(const void* data, std::size_t size) {
    if (size > capacity_ - size_) return false;
    const auto* in = static_cast<const std::uint8_t*>(data);
    while (size > 0) {
        if (chunks_.empty() || tail_ == kChunk) {
            chunks_.push_back(std::make_unique_for_overwrite<Chunk>());  // not zeroed: written before read
            tail_ = 0;
        }
        const std::size_t n = std::min(size, kChunk - tail_);
        std::memcpy(chunks_.back()->bytes + tail_, in, n);
        tail_ += n;
        in += n;
        size -= n;
        size_ += n;
    }
    high_water_ = std::max(high_water_, size_);
    return true;
}

std::span<const std::uint8_t> DebugBuffer::front() const {
    if (size_ == 0) return {};
    const std::size_t end = chunks_.size() == 1 ? tail_ : kChunk;
    return {chunks_.front()->bytes + head_, end - head_};
}

void DebugBuffer::consume(std::size_t size) {
    size = std::min(size, size_);
    while (size > 0) {
        const std::size_t end = chunks_.size() == 1 ? tail_ : kChunk;
        const std::size_t n = std::min(size, end - head_);
        head_ += n;
        size -= n;
        size_ -= n;
        if (head_ == end) {
            chunks_.pop_front();
            head_ = 0;
            if (chunks_.empty()) tail_ = 0;
        }
    }
}

void DebugBuffer::clear() {
    chunks_.clear();
    head_ = tail_ = size_ = 0;
}

}  // namespace iprobe::proxy
