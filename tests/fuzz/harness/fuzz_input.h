// What every harness needs: the fuzzer's bytes as a file (the readers under
// test take paths or descriptors, as they do in production), and one rule
// for failures.
//
// A reader may refuse bad input only with iprobe::Error (the tools turn it
// into an exit code and a message).  Any other exception escapes the
// harness, and libFuzzer reports it as a crash: std::bad_alloc or
// std::length_error from a hostile size is exactly the defect we hunt.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe::fuzz {

inline UniqueFd memfd_holding(const std::uint8_t* data, std::size_t size, bool seal_size = false) {
    UniqueFd fd(::memfd_create("iprobe-fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd) std::abort();
    for (std::size_t done = 0; done < size;) {
        const ssize_t n = ::write(fd.get(), data + done, size - done);
        if (n <= 0) std::abort();
        done += static_cast<std::size_t>(n);
    }
    if (seal_size && ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) std::abort();
    return fd;
}

inline std::string path_of(const UniqueFd& fd) { return "/proc/self/fd/" + std::to_string(fd.get()); }

// Runs `body`, accepting iprobe::Error as the reader's refusal.
template <typename Body>
void refusal_allowed(Body&& body) {
    try {
        body();
    } catch (const iprobe::Error& e) {
        // IPROBE_FUZZ_VERBOSE=1: say why an input was refused (to check a seed goes deep).
        static const bool verbose = std::getenv("IPROBE_FUZZ_VERBOSE") != nullptr;
        if (verbose) std::fprintf(stderr, "refused: %s\n", e.what());
    }
}

// A property the reader must keep: a violation is a crash to libFuzzer.
inline void require(bool holds) {
    if (!holds) std::abort();
}

}  // namespace iprobe::fuzz
