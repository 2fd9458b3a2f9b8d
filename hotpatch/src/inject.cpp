#include "inject.h"

#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "iprobe/support/error.h"
#include "iprobe/support/install_layout.h"
#include "region.h"

namespace iprobe::hotpatch {

namespace {

// Return addresses of a stopped thread, innermost first, unwound with the
// modules' CFI (libdw).  The threads are ours already: libdwfl gets their
// registers and memory from us (dwfl_attach_state), never ptrace-attaches
// itself.
class StackWalker {
public:
    explicit StackWalker(const StoppedProcess& process) : process_(process) {
        // .eh_frame CFI is enough; never look for (or download) debuginfo.
        static const Dwfl_Callbacks callbacks = {
            dwfl_linux_proc_find_elf,
            [](Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word, char**) { return -1; },
            nullptr, nullptr};
        static const Dwfl_Thread_Callbacks thread_callbacks = {next_thread, get_thread, memory_read,
                                                               set_initial_registers, nullptr, nullptr};
        dwfl_ = dwfl_begin(&callbacks);
        if (!dwfl_) return;
        if (dwfl_linux_proc_report(dwfl_, process.pid()) != 0 || dwfl_report_end(dwfl_, nullptr, nullptr) != 0 ||
            !dwfl_attach_state(dwfl_, nullptr, process.pid(), &thread_callbacks, this)) {
            dwfl_end(dwfl_);
            dwfl_ = nullptr;
        }
    }
    ~StackWalker() {
        if (dwfl_) dwfl_end(dwfl_);
    }
    StackWalker(const StackWalker&) = delete;
    StackWalker& operator=(const StackWalker&) = delete;

    // Empty when the walk is not possible.
    std::vector<std::uint64_t> frames(pid_t tid, std::size_t max_frames = 64) {
        std::vector<std::uint64_t> pcs;
        if (!dwfl_) return pcs;
        struct Ctx {
            std::vector<std::uint64_t>* pcs;
            std::size_t max;
        } ctx{&pcs, max_frames};
        dwfl_getthread_frames(
            dwfl_, tid,
            [](Dwfl_Frame* frame, void* arg) -> int {
                auto* c = static_cast<Ctx*>(arg);
                Dwarf_Addr pc = 0;
                bool activation = false;
                if (!dwfl_frame_pc(frame, &pc, &activation)) return DWARF_CB_ABORT;
                c->pcs->push_back(activation ? pc : pc - 1);
                return c->pcs->size() >= c->max ? DWARF_CB_ABORT : DWARF_CB_OK;
            },
            &ctx);
        return pcs;
    }

private:
    static const StoppedProcess& process_of(void* arg) { return static_cast<StackWalker*>(arg)->process_; }

    static pid_t next_thread(Dwfl*, void* arg, void** thread_arg) {
        const auto& threads = process_of(arg).threads();
        const auto* previous = static_cast<const StoppedThread*>(*thread_arg);
        const std::size_t next = previous ? static_cast<std::size_t>(previous - threads.data()) + 1 : 0;
        if (next >= threads.size()) return 0;
        *thread_arg = const_cast<StoppedThread*>(&threads[next]);
        return threads[next].tid;
    }
    static bool get_thread(Dwfl*, pid_t tid, void* arg, void** thread_arg) {
        for (const auto& t : process_of(arg).threads())
            if (t.tid == tid) {
                *thread_arg = const_cast<StoppedThread*>(&t);
                return true;
            }
        return false;
    }
    static bool memory_read(Dwfl*, Dwarf_Addr address, Dwarf_Word* result, void* arg) {
        try {
            process_of(arg).read(address, result, sizeof *result);
            return true;
        } catch (const Error&) {
            return false;
        }
    }
    // DWARF register numbers of x86-64: rax rdx rcx rbx rsi rdi rbp rsp r8..r15, then the return address (rip).
    static bool set_initial_registers(Dwfl_Thread* thread, void* thread_arg) {
        const user_regs_struct& r = static_cast<const StoppedThread*>(thread_arg)->regs;
        const Dwarf_Word regs[17] = {r.rax, r.rdx, r.rcx, r.rbx, r.rsi, r.rdi, r.rbp, r.rsp, r.r8,
                                     r.r9,  r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rip};
        return dwfl_thread_state_registers(thread, 0, 17, regs) && (dwfl_thread_state_register_pc(thread, r.rip), true);
    }

    const StoppedProcess& process_;
    Dwfl* dwfl_ = nullptr;
};

}  // namespace

ElfCache& elf_cache() {
    static ElfCache cache;
    return cache;
}

std::optional<LoadedLibrary> find_loaded(pid_t pid, const std::vector<RunningModule>& modules,
                                         const std::string& wanted_path) {
    const std::string wanted = canonical_or_same(wanted_path);
    const RunningModule* hit = nullptr;
    for (const auto& m : modules)
        if (m.path == wanted || m.path == wanted_path) hit = &m;
    if (!hit)
        for (const auto& m : modules)
            if (basename_of(m.path) == basename_of(wanted_path)) hit = &m;
    if (!hit) return std::nullopt;
    LoadedLibrary lib;
    lib.path = hit->path;
    lib.bias = hit->load_bias;
    lib.elf = elf_cache().get(pid, hit->path);
    return lib;
}

LoadedLibrary libc_of(pid_t pid, const std::vector<RunningModule>& modules) {
    for (const auto& m : modules)
        if (basename_of(m.path).rfind("libc.so", 0) == 0) {
            LoadedLibrary lib;
            lib.path = m.path;
            lib.bias = m.load_bias;
            lib.elf = elf_cache().get(pid, m.path);
            return lib;
        }
    throw Error("process " + std::to_string(pid) + " has no libc.so mapped; iprobe needs a dynamically linked glibc target",
                ExitCode::unavailable);
}

std::string unsafe_for_dlopen(const StoppedProcess& process, const std::vector<Mapping>& maps,
                              const LoadedLibrary& libc) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const char* name : {"malloc", "free", "calloc", "realloc", "memalign", "posix_memalign", "aligned_alloc",
                             "valloc", "pvalloc", "malloc_trim", "__libc_malloc", "__libc_free", "__libc_calloc",
                             "__libc_realloc", "__libc_memalign", "dl_iterate_phdr", "dlopen", "dlclose", "dlsym",
                             "fork", "_Fork"}) {
        const elf::ElfSymbol* s = libc.elf->symbol_named(name);
        if (s && s->defined() && s->size) ranges.emplace_back(libc.bias + s->address, libc.bias + s->address + s->size);
    }
    for (const auto& m : maps)
        if (m.executable() && basename_of(m.path).rfind("ld-linux", 0) == 0) ranges.emplace_back(m.start, m.end);
    auto inside = [&](std::uint64_t a) {
        return std::any_of(ranges.begin(), ranges.end(), [&](auto& r) { return a >= r.first && a < r.second; });
    };
    StackWalker walker(process);
    for (const auto& t : process.threads()) {
        if (inside(t.regs.rip)) return "thread " + std::to_string(t.tid) + " is inside malloc or the dynamic loader";
        for (std::uint64_t pc : walker.frames(t.tid))
            if (inside(pc)) return "thread " + std::to_string(t.tid) + " is inside malloc or the dynamic loader";
    }
    return {};
}

std::string read_c_string(const StoppedProcess& process, std::uint64_t address) {
    std::string out;
    char buf[256];
    for (int i = 0; i < 16; i++) {
        process.read(address + out.size(), buf, sizeof buf);
        const void* nul = std::memchr(buf, 0, sizeof buf);
        if (nul) return out + std::string(buf, static_cast<std::size_t>(static_cast<const char*>(nul) - buf));
        out.append(buf, sizeof buf);
    }
    return out;
}

std::uint64_t sigreturn_code(const LoadedLibrary& libc) {
    // glibc's __restore_rt, the return address of every signal handler it
    // installs: mov $15, %rax; syscall.  Not exported: found in .text.
    static const std::uint8_t kCode[] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};
    static std::map<const elf::ElfFile*, std::uint64_t> found;  // ElfFiles live in elf_cache()
    auto [it, fresh] = found.try_emplace(libc.elf.get(), 0);
    if (fresh)
        if (const elf::ElfSection* text = libc.elf->section(".text")) {
            const auto bytes = libc.elf->section_bytes(*text);
            const auto at = std::search(bytes.begin(), bytes.end(), std::begin(kCode), std::end(kCode));
            if (at != bytes.end()) it->second = text->address + static_cast<std::uint64_t>(at - bytes.begin());
        }
    return it->second ? libc.bias + it->second : 0;
}

void use_landings(StoppedProcess& process, const LoadedLibrary& libc, const std::optional<LoadedLibrary>& runtime) {
    StoppedProcess::CallLanding landing;
    landing.sigreturn = sigreturn_code(libc);
    if (runtime) landing.with_result = runtime->symbol("iprobe_rt_call_landing").value_or(0);
    if (!landing.sigreturn && !landing.with_result)
        throw Error("cannot call functions in process " + std::to_string(process.pid()) + " safely: its libc (" +
                        libc.path + ") has no signal-return code iprobe recognises; start it with LD_PRELOAD=" +
                        default_runtime_library(),
                    ExitCode::unavailable);
    process.set_landing(landing);
}

namespace {

std::string syscall_name(long nr) {
    static const std::map<long, const char*> names = {{0, "read"},      {2, "open"},     {3, "close"},
                                                      {5, "fstat"},     {9, "mmap"},     {10, "mprotect"},
                                                      {257, "openat"},  {262, "newfstatat"}};
    const auto it = names.find(nr);
    return it != names.end() ? it->second : "system call " + std::to_string(nr);
}

}  // namespace

void remote_dlopen(StoppedProcess& process, const LoadedLibrary& libc, const std::string& path) {
    const auto dlopen_at = libc.symbol("dlopen");
    if (!dlopen_at)
        throw Error("this glibc does not export dlopen from libc.so.6 (glibc >= 2.34 needed); start the target with "
                    "LD_PRELOAD=" + path,
                    ExitCode::unavailable);
    const std::uint64_t handle = process.call(*dlopen_at, {RTLD_NOW | RTLD_GLOBAL}, &path);
    // Without a landing that keeps rax the handle is unknown: the maps say
    // whether the library came in (ensure_library).
    if (!process.landing().with_result || handle != 0) return;
    std::string why;
    if (auto dlerror_at = libc.symbol("dlerror"))
        if (const std::uint64_t msg = process.call(*dlerror_at, {})) why = read_c_string(process, msg);
    throw Error("dlopen(" + path + ") failed inside process " + std::to_string(process.pid()) + ": " + why,
                ExitCode::failure);
}

HandlerSymbols resolve_handlers(const AttachOptions& options) {
    HandlerSymbols h = options.handlers;
    if (h.enter.empty() && h.exit.empty() && h.point.empty()) {
        const std::string lib = h.library;
        h = HandlerSymbols::runtime(options.mode);
        h.library = lib;
    }
    return h;
}

std::string runtime_path_of(const AttachOptions& options) {
    const std::string path = options.runtime_library.empty() ? default_runtime_library() : options.runtime_library;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0)
        throw Error("runtime library " + path + " not found; build target iprobe_rt or set IPROBE_RUNTIME",
                    ExitCode::not_found);
    if (!runtime_file_name(basename_of(path)))
        throw Error("runtime library " + path + ": its file name must begin with libiprobe-rt and end in .so (report, " +
                        "trace and status find the runtime in a process by that name); copy it as DIR/" + kRuntimeName,
                    ExitCode::usage);
    return canonical_or_same(path);
}

std::string make_visible_to(pid_t pid, const std::string& path) {
    const std::string there = target_view(pid, path);
    struct stat st {};
    if (::stat(there.c_str(), &st) == 0) return {};
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(there).parent_path(), ec);
    const std::string tmp = there + ".iprobe-tmp";
    if (!ec) std::filesystem::copy_file(path, tmp, std::filesystem::copy_options::overwrite_existing, ec);
    if (!ec) std::filesystem::permissions(tmp, std::filesystem::perms(0755), ec);
    if (!ec) std::filesystem::rename(tmp, there, ec);
    if (ec) {
        std::filesystem::remove(tmp, ec);
        throw Error("process " + std::to_string(pid) + " does not see " + path +
                        " (it runs in another mount namespace, a container) and it cannot be copied there: " +
                        ec.message() + "; make the library reachable at the same path inside it, or use --runtime",
                    ExitCode::unavailable);
    }
    return there;
}

Injected ensure_library(StoppedProcess& process, std::vector<Mapping>& maps, std::vector<RunningModule>& modules,
                        const LoadedLibrary& libc, const std::string& path, Clock::time_point deadline) {
    if (auto lib = find_loaded(process.pid(), modules, path)) return {*lib, false};
    const std::string unsafe = unsafe_for_dlopen(process, maps, libc);
    if (!unsafe.empty()) {
        if (Clock::now() > deadline)
            throw Error("cannot load " + basename_of(path) + " into process " + std::to_string(process.pid()) +
                            " now: " + unsafe + " (retried until the timeout); retry later or start it with LD_PRELOAD=" +
                            path,
                        ExitCode::busy);
        throw RetryLater{};
    }
    const std::string copied = make_visible_to(process.pid(), path);
    std::optional<LoadedLibrary> lib;
    try {
        remote_dlopen(process, libc, path);
        maps = read_maps(process.pid());
        modules = running_modules(process.memory(), maps);
        lib = find_loaded(process.pid(), modules, path);
        if (!lib) {
            const auto [nr, err] = process.last_call_failed_syscall();
            throw Error("dlopen(" + path + ") failed inside process " + std::to_string(process.pid()) +
                            (err ? ": " + syscall_name(nr) + " failed in it: " + std::strerror(err)
                                 : std::string(": the library is not mapped after it")),
                        ExitCode::failure);
        }
    } catch (...) {
        std::error_code ec;
        if (!copied.empty()) std::filesystem::remove(copied, ec);
        throw;
    }
    return {*lib, true};
}

HandlerSymbols HandlerSymbols::runtime(HandlerMode mode) {
    const std::string m = mode == HandlerMode::count ? "count" : "trace";
    HandlerSymbols h;
    h.enter = "iprobe_rt_" + m + "_enter";
    h.exit = "iprobe_rt_" + m + "_exit";
    h.point = "iprobe_rt_" + m + "_point";
    h.enter_nop = h.enter + "_nop";
    h.exit_nop = h.exit + "_nop";
    h.point_nop = h.point + "_nop";
    if (mode == HandlerMode::count) {
        h.enter_id = h.exit_id = "iprobe_rt_count_counter";
        h.site_id = SiteId::counter;
        h.entry_enter = "iprobe_rt_count_counter_nop";  // the slow path: its fast path is inlined in the stub
    } else {
        h.enter_id = "iprobe_rt_trace_enter_id";
        h.exit_id = "iprobe_rt_trace_exit_id";
        h.site_id = SiteId::probe;
        h.entry_enter = "iprobe_rt_trace_enter_id_nop";
    }
    h.entry_return = "iprobe_rt_" + m + "_return_nop";
    h.entry_enter_return = "iprobe_rt_" + m + "_enter_return_nop";
    return h;
}

std::string default_runtime_library() {
    if (const char* env = std::getenv("IPROBE_RUNTIME"); env && *env) return env;
    if (auto found = InstallLayout::current().library(kRuntimeName)) return found->string();
    return std::string("/usr/local/lib/") + kRuntimeName;
}

}  // namespace iprobe::hotpatch
