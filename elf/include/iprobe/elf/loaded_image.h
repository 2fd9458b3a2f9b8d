// An ELF module as the loader mapped it, read through a caller's accessor
// (another process's memory): what hotpatch must know of the code actually
// running, which may no longer match any file on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace iprobe::elf {

struct LoadedImage {
    std::uint64_t first_load_vaddr = 0;  // page-aligned: mapping base - load bias
    std::uint64_t load_end_vaddr = 0;    // end of the last PT_LOAD segment (p_vaddr + p_memsz)
    // Link-time [start, end) of the executable PT_LOAD segments.
    std::vector<std::pair<std::uint64_t, std::uint64_t>> code_segments;
    std::vector<std::uint8_t> build_id;  // empty when the image has none
};

// Copies `size` bytes at `address` into `out`; throws when they cannot be read.
using ReadMemory = std::function<void(std::uint64_t address, void* out, std::size_t size)>;

// The image whose ELF header is at `base`.  nullopt when that is not a
// 64-bit ELF image or its headers cannot be read.
std::optional<LoadedImage> read_loaded_image(std::uint64_t base, const ReadMemory& read);

// The GNU build-id in a PT_NOTE segment's bytes; empty when there is none.
std::vector<std::uint8_t> build_id_from_notes(std::span<const std::uint8_t> notes);

}  // namespace iprobe::elf
