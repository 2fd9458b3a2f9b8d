#include "iprobe/elf/loaded_image.h"

#include <elf.h>

#include <algorithm>
#include <cstring>

namespace iprobe::elf {

std::vector<std::uint8_t> build_id_from_notes(std::span<const std::uint8_t> notes) {
    std::size_t at = 0;
    while (at + sizeof(Elf64_Nhdr) <= notes.size()) {
        Elf64_Nhdr header;
        std::memcpy(&header, notes.data() + at, sizeof header);
        const std::size_t name_at = at + sizeof header;
        const std::size_t desc_at = name_at + ((header.n_namesz + 3) & ~3u);
        const std::size_t next = desc_at + ((header.n_descsz + 3) & ~3u);
        if (next > notes.size()) break;
        if (header.n_type == NT_GNU_BUILD_ID && header.n_namesz == 4 &&
            std::memcmp(notes.data() + name_at, "GNU", 4) == 0)
            return {notes.begin() + static_cast<long>(desc_at),
                    notes.begin() + static_cast<long>(desc_at + header.n_descsz)};
        at = next;
    }
    return {};
}

std::optional<LoadedImage> read_loaded_image(std::uint64_t base, const ReadMemory& read) {
    try {
        Elf64_Ehdr ehdr{};
        read(base, &ehdr, sizeof ehdr);
        if (std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) != 0 || ehdr.e_ident[EI_CLASS] != ELFCLASS64 ||
            ehdr.e_phentsize != sizeof(Elf64_Phdr) || ehdr.e_phnum == 0 || ehdr.e_phnum > 256)
            return std::nullopt;
        std::vector<Elf64_Phdr> phdrs(ehdr.e_phnum);
        read(base + ehdr.e_phoff, phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr));
        LoadedImage image;
        std::uint64_t first_load = ~0ull;
        for (const auto& ph : phdrs)
            if (ph.p_type == PT_LOAD && ph.p_vaddr <= UINT64_MAX - ph.p_memsz) {
                first_load = std::min<std::uint64_t>(first_load, ph.p_vaddr & ~0xfffull);
                image.load_end_vaddr = std::max<std::uint64_t>(image.load_end_vaddr, ph.p_vaddr + ph.p_memsz);
            }
        if (first_load == ~0ull) return std::nullopt;
        image.first_load_vaddr = first_load;
        const std::uint64_t load_bias = base - first_load;
        for (const auto& ph : phdrs)
            if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && ph.p_vaddr <= UINT64_MAX - ph.p_memsz)
                image.code_segments.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_memsz);
        for (const auto& ph : phdrs) {
            // A note segment is a few dozen bytes; a huge one is not a real image's.
            if (ph.p_type != PT_NOTE || ph.p_filesz > 65536) continue;
            std::vector<std::uint8_t> notes(ph.p_filesz);
            read(load_bias + ph.p_vaddr, notes.data(), notes.size());
            image.build_id = build_id_from_notes(notes);
            if (!image.build_id.empty()) break;
        }
        return image;
    } catch (...) {
        return std::nullopt;
    }
}

}  // namespace iprobe::elf
