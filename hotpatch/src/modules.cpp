#include "modules.h"

#include <elf.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>

namespace iprobe::hotpatch {

namespace {

std::vector<std::uint8_t> build_id_from_notes(const std::vector<std::uint8_t>& notes) {
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

// ELF header, program headers and notes as loaded in the target.
bool inspect_image(const ProcessMemory& process, RunningModule& module) {
    Elf64_Ehdr ehdr{};
    try {
        process.read(module.base, &ehdr, sizeof ehdr);
        if (std::memcmp(ehdr.e_ident, ELFMAG, SELFMAG) != 0 || ehdr.e_ident[EI_CLASS] != ELFCLASS64 ||
            ehdr.e_phentsize != sizeof(Elf64_Phdr) || ehdr.e_phnum == 0 || ehdr.e_phnum > 256)
            return false;
        std::vector<Elf64_Phdr> phdrs(ehdr.e_phnum);
        process.read(module.base + ehdr.e_phoff, phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr));
        std::uint64_t first_load = ~0ull;
        for (const auto& ph : phdrs)
            if (ph.p_type == PT_LOAD) first_load = std::min<std::uint64_t>(first_load, ph.p_vaddr & ~0xfffull);
        if (first_load == ~0ull) return false;
        module.load_bias = module.base - first_load;
        for (const auto& ph : phdrs)
            if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && ph.p_vaddr <= UINT64_MAX - ph.p_memsz)
                module.code_segments.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_memsz);
        for (const auto& ph : phdrs) {
            if (ph.p_type != PT_NOTE || ph.p_filesz > 65536) continue;
            std::vector<std::uint8_t> notes(ph.p_filesz);
            process.read(module.load_bias + ph.p_vaddr, notes.data(), notes.size());
            module.build_id = build_id_from_notes(notes);
            if (!module.build_id.empty()) break;
        }
        return true;
    } catch (...) {
        return false;
    }
}

}  // namespace

std::vector<RunningModule> running_modules(const ProcessMemory& process, const std::vector<Mapping>& maps) {
    std::map<std::string, RunningModule> by_path;
    for (const auto& m : maps) {
        if (m.path.empty() || m.path[0] != '/') continue;
        auto& module = by_path[m.path];
        if (module.path.empty()) {
            module.path = m.path;
            module.low = m.start;
        }
        if (m.offset == 0 && module.base == 0) module.base = m.start;
        module.low = std::min(module.low, m.start);
        module.high = std::max(module.high, m.end);
        if (m.executable()) {
            if (module.text_low == 0 || m.start < module.text_low) module.text_low = m.start;
            module.text_high = std::max(module.text_high, m.end);
        }
    }
    std::vector<RunningModule> modules;
    for (auto& [path, module] : by_path)
        if (module.base != 0 && module.text_low != 0 && inspect_image(process, module))
            modules.push_back(std::move(module));
    return modules;
}

bool RunningModule::holds_code(std::uint64_t link_address, std::uint64_t size) const {
    return std::any_of(code_segments.begin(), code_segments.end(), [&](const auto& s) {
        return link_address >= s.first && link_address < s.second && size <= s.second - link_address;
    });
}

const RunningModule* find_module_by_path(const std::vector<RunningModule>& modules, const std::string& path) {
    for (const auto& m : modules)
        if (m.path == path) return &m;
    return nullptr;
}

std::string target_view(pid_t pid, const std::string& path) {
    return "/proc/" + std::to_string(pid) + "/root" + path;
}

}  // namespace iprobe::hotpatch
