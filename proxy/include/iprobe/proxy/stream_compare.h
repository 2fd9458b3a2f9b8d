// Byte-exact comparison of two streams that arrive at different speeds: the
// side that is ahead keeps its unmatched bytes (bounded) until the other
// catches up.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "iprobe/proxy/debug_buffer.h"

namespace iprobe::proxy {

class StreamComparer {
public:
    enum class Result { same, mismatch, too_far_apart };

    explicit StreamComparer(std::size_t capacity) : ahead_{DebugBuffer(capacity), DebugBuffer(capacity)} {}

    // `side` 0 is the reference (production), 1 the copy.
    Result feed(int side, std::span<const std::uint8_t> bytes) {
        DebugBuffer& other = ahead_[1 - side];
        std::size_t i = 0;
        while (i < bytes.size() && !other.empty()) {
            const auto front = other.front();
            const std::size_t n = std::min(front.size(), bytes.size() - i);
            for (std::size_t k = 0; k < n; ++k) {
                if (front[k] != bytes[i + k]) {
                    matched_ += k;  // every byte before the difference was found equal
                    mismatch_offset_ = matched_;
                    reference_excerpt_ = excerpt(side == 0 ? bytes.subspan(i + k) : front.subspan(k));
                    copy_excerpt_ = excerpt(side == 1 ? bytes.subspan(i + k) : front.subspan(k));
                    return Result::mismatch;
                }
            }
            other.consume(n);
            matched_ += n;
            i += n;
        }
        if (i < bytes.size() && !ahead_[side].append(bytes.data() + i, bytes.size() - i)) return Result::too_far_apart;
        return Result::same;
    }

    // Bytes found equal: up to the first difference once there is one.
    std::uint64_t matched() const { return matched_; }
    std::size_t unmatched(int side) const { return ahead_[side].size(); }
    std::uint64_t mismatch_offset() const { return mismatch_offset_; }
    const std::string& reference_excerpt() const { return reference_excerpt_; }
    const std::string& copy_excerpt() const { return copy_excerpt_; }

private:
    static std::string excerpt(std::span<const std::uint8_t> s) {
        return std::string(reinterpret_cast<const char*>(s.data()), std::min<std::size_t>(s.size(), 64));
    }
    DebugBuffer ahead_[2];
    std::uint64_t matched_ = 0;
    std::uint64_t mismatch_offset_ = 0;
    std::string reference_excerpt_, copy_excerpt_;
};

}  // namespace iprobe::proxy
