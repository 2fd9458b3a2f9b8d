// Loading a library (the runtime, a handler) into a stopped target: a dlopen
// called in it, only when no thread is inside the loader or malloc.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "iprobe/elf/elf_file.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "modules.h"
#include "process.h"
#include "session.h"

namespace iprobe::hotpatch {

struct LoadedLibrary {
    std::string path;  // as mapped
    std::uint64_t bias = 0;
    std::shared_ptr<elf::ElfFile> elf;

    std::optional<std::uint64_t> symbol(const std::string& name) const {
        const elf::ElfSymbol* s = elf->symbol_named(name);
        if (!s || !s->defined()) return std::nullopt;
        return bias + s->address;
    }
};

// ELF files parsed before the world stops: parsing libc takes milliseconds.
class ElfCache {
public:
    std::shared_ptr<elf::ElfFile> get(pid_t pid, const std::string& mapped_path) {
        auto& slot = files_[mapped_path];
        if (!slot)
            slot = reading_target(pid, [&] { return std::make_shared<elf::ElfFile>(target_view(pid, mapped_path)); });
        return slot;
    }
    void preload(pid_t pid, const std::string& mapped_path) {
        try {
            get(pid, mapped_path);
        } catch (const Error&) {
        }
    }

private:
    std::map<std::string, std::shared_ptr<elf::ElfFile>> files_;
};

ElfCache& elf_cache();

std::optional<LoadedLibrary> find_loaded(pid_t pid, const std::vector<RunningModule>& modules,
                                         const std::string& wanted_path);

LoadedLibrary libc_of(pid_t pid, const std::vector<RunningModule>& modules);

// Is it safe to run dlopen in the target now?  Not while a thread is inside
// the allocator or the dynamic loader (it may hold their locks): its PC, or
// a frame of its unwound stack, lies in them.
std::string unsafe_for_dlopen(const StoppedProcess& process, const std::vector<Mapping>& maps,
                              const LoadedLibrary& libc);

std::string read_c_string(const StoppedProcess& process, std::uint64_t address);

// Where `process`'s function calls return (StoppedProcess::CallLanding):
// libc's signal-return code, and the runtime's landing once it is loaded.
std::uint64_t sigreturn_code(const LoadedLibrary& libc);
void use_landings(StoppedProcess& process, const LoadedLibrary& libc, const std::optional<LoadedLibrary>& runtime);

// dlopen(path) inside the target; the caller checks the maps for it.
void remote_dlopen(StoppedProcess& process, const LoadedLibrary& libc, const std::string& path);

HandlerSymbols resolve_handlers(const AttachOptions& options);

std::string runtime_path_of(const AttachOptions& options);

struct Injected {
    LoadedLibrary library;
    bool injected = false;
};

// A target in a mount namespace of its own (a container) has no `path`: the
// library is put there, at the same path, for its dlopen.  Returns the copy
// made ("" when the target already sees the library), for removal if the
// injection fails.
std::string make_visible_to(pid_t pid, const std::string& path);

Injected ensure_library(StoppedProcess& process, std::vector<Mapping>& maps, std::vector<RunningModule>& modules,
                        const LoadedLibrary& libc, const std::string& path, Clock::time_point deadline);

}  // namespace iprobe::hotpatch
