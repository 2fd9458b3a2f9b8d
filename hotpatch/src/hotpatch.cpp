#include "iprobe/hotpatch/hotpatch.h"

#include <dlfcn.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <array>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "iprobe/elf/elf_file.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/runtime/rt.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/lock_file.h"
#include "modules.h"
#include "process.h"
#include "region.h"
#include "live_sites.h"
#include "stubs.h"

namespace iprobe::hotpatch {

namespace {

using Clock = std::chrono::steady_clock;

// A thread was at a site about to change (or in code that must not be
// interrupted): let the target run briefly and try again.
struct RetryLater {};
constexpr std::uint64_t kPage = 4096;
constexpr std::int64_t kReach = (1ll << 31) - 2 * static_cast<std::int64_t>(kPage);
constexpr const char* kRuntimeName = "libiprobe-rt.so";

std::string basename_of(const std::string& path) {
    const auto slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string canonical_or_same(const std::string& path) {
    std::error_code ec;
    auto c = std::filesystem::canonical(path, ec);
    return ec ? path : c.string();
}

// One attach or detach per target at a time: the second gets ExitCode::busy.
class SessionLock {
public:
    explicit SessionLock(pid_t pid)
        : lock_(std::to_string(pid) + ".lock", "another iprobe session is attaching to or detaching from process " +
                                                   std::to_string(pid) + "; wait for it to finish and retry") {}

private:
    LockFile lock_;
};

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
        if (!slot) slot = std::make_shared<elf::ElfFile>(target_view(pid, mapped_path));
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

// Is it safe to run dlopen in the target now?  Not while a thread is inside
// the allocator or the dynamic loader (it may hold their locks): its PC, or
// a frame of its unwound stack, lies in them.
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

std::uint64_t remote_dlopen(StoppedProcess& process, const LoadedLibrary& libc, const std::string& path) {
    const auto dlopen_at = libc.symbol("dlopen");
    if (!dlopen_at)
        throw Error("this glibc does not export dlopen from libc.so.6 (glibc >= 2.34 needed); start the target with "
                    "LD_PRELOAD=" + path,
                    ExitCode::unavailable);
    const std::uint64_t handle = process.call(*dlopen_at, {RTLD_NOW | RTLD_GLOBAL}, &path);
    if (handle == 0) {
        std::string why;
        if (auto dlerror_at = libc.symbol("dlerror"))
            if (const std::uint64_t msg = process.call(*dlerror_at, {})) why = read_c_string(process, msg);
        throw Error("dlopen(" + path + ") failed inside process " + std::to_string(process.pid()) + ": " + why,
                    ExitCode::failure);
    }
    return handle;
}

// A free, page-aligned address from which every byte of [low, high) is
// within a rel32 call.  Prefers the gap just below the module; never the
// room right after [heap], which brk grows into.
std::optional<std::uint64_t> stub_address(const std::vector<Mapping>& maps, std::uint64_t low, std::uint64_t high,
                                          std::uint64_t size = kPage) {
    std::optional<std::uint64_t> best;
    std::uint64_t best_distance = ~0ull;
    std::uint64_t prev_end = 0x10000;
    std::string prev_path;
    auto consider = [&](std::uint64_t gap_low, std::uint64_t gap_high, bool after_heap) {
        if (gap_high <= gap_low || gap_high - gap_low < size) return;
        std::uint64_t candidate;
        if (gap_high <= low) candidate = gap_high - size;
        else if (after_heap) candidate = gap_high - size;
        else candidate = gap_low;
        const std::int64_t far = static_cast<std::int64_t>(std::max(
            candidate > low ? candidate + size - low : high - candidate, high > candidate ? high - candidate : candidate + size - low));
        if (far >= kReach) return;
        const std::uint64_t distance = candidate < low ? low - candidate : candidate - high;
        if (distance < best_distance) best = candidate, best_distance = distance;
    };
    for (const auto& m : maps) {
        consider(prev_end, m.start, prev_path == "[heap]");
        prev_end = std::max(prev_end, m.end);
        prev_path = m.path;
    }
    consider(prev_end, 0x7ffffffff000ull, prev_path == "[heap]");
    return best;
}

struct Patch {
    std::uint64_t address = 0;
    SiteBytes before, after;
};

void sort_by_address(std::vector<Patch>& patches) {
    std::sort(patches.begin(), patches.end(), [](auto& a, auto& b) { return a.address < b.address; });
}

// Writes all patches (sorted by address) page-run by page-run through
// /proc/PID/mem, reads them back; on any failure puts back what was written
// and rethrows.
void apply_patches(StoppedProcess& process, const std::vector<Patch>& patches) {
    struct Run {
        std::uint64_t low, high;
        std::vector<std::uint8_t> before, after;
    };
    std::vector<Run> runs;
    for (std::size_t i = 0; i < patches.size();) {
        std::size_t j = i;
        std::uint64_t high = patches[i].address + patches[i].after.size;
        // One read-modify-write per span of nearby sites: unchanged bytes in
        // between are rewritten as they are (every thread is stopped), and a
        // page holding a site is copied-on-write anyway.
        while (j + 1 < patches.size() && patches[j + 1].address < high + kPage) {
            j++;
            high = std::max<std::uint64_t>(high, patches[j].address + patches[j].after.size);
        }
        Run run{patches[i].address, high, {}, {}};
        run.before.resize(high - run.low);
        process.read(run.low, run.before.data(), run.before.size());
        run.after = run.before;
        for (std::size_t k = i; k <= j; k++) {
            const auto& p = patches[k];
            if (!std::equal(p.before.begin(), p.before.end(), run.before.begin() + static_cast<long>(p.address - run.low)))
                throw Error("site " + hex_address(p.address) + " changed under us; nothing was written");
            std::copy(p.after.begin(), p.after.end(), run.after.begin() + static_cast<long>(p.address - run.low));
        }
        runs.push_back(std::move(run));
        i = j + 1;
    }
    std::size_t written = 0;
    try {
        for (; written < runs.size(); written++) {
            auto& run = runs[written];
            process.write(run.low, run.after.data(), run.after.size());
            std::vector<std::uint8_t> check(run.after.size());
            process.read(run.low, check.data(), check.size());
            if (check != run.after) throw Error("read-back of the patch at " + hex_address(run.low) + " differs");
        }
    } catch (...) {
        for (std::size_t k = 0; k <= written && k < runs.size(); k++) {
            try {
                process.write(runs[k].low, runs[k].before.data(), runs[k].before.size());
            } catch (...) {
            }
        }
        throw;
    }
}

// No thread may be stopped strictly inside a range about to change
// (`patches` sorted by address).
std::string unsafe_pcs(const StoppedProcess& process, const std::vector<Patch>& patches) {
    for (const auto& t : process.threads()) {
        const std::uint64_t pc = t.regs.rip;
        auto it = std::upper_bound(patches.begin(), patches.end(), pc,
                                   [](std::uint64_t v, const Patch& p) { return v < p.address; });
        if (it == patches.begin()) continue;
        --it;
        if (pc > it->address && pc < it->address + it->after.size)
            return "thread " + std::to_string(t.tid) + " is inside site " + hex_address(it->address);
    }
    return {};
}

std::uint64_t elapsed_us(Clock::time_point since) {
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - since).count());
}

struct Target {
    uid_t uid = 0;
    gid_t gid = 0;
};

Target target_owner(pid_t pid) {
    struct stat st {};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0)
        throw Error("no such process: " + std::to_string(pid), ExitCode::not_found);
    return {st.st_uid, st.st_gid};
}

// The pid the target sees for itself (differs inside a PID namespace).
pid_t pid_in_own_namespace(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("NSpid:", 0) == 0) {
            std::istringstream fields(line.substr(6));
            pid_t last = pid, v = 0;
            while (fields >> v) last = v;
            return last;
        }
    return pid;
}

struct SelectedList {
    std::string source;
    ProbeList list;
    std::vector<const Probe*> selected;
};

std::string describe_selector(const ProbeSelector& s) {
    std::string out;
    for (auto& g : s.function_globs) out += (out.empty() ? "" : ",") + g;
    if (!s.file_globs.empty()) {
        out += " files ";
        for (auto& g : s.file_globs) out += g + " ";
    }
    return out.empty() ? "(all)" : out;
}

std::vector<SelectedList> load_lists(const AttachOptions& options) {
    std::vector<std::string> sources = options.probe_sources;
    if (sources.empty()) {
        std::error_code ec;
        const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(options.pid) + "/exe", ec);
        if (ec) {
            // The target died in the meantime (gone, or a zombie, which has
            // no executable any more): that is "no such process".
            if (ec == std::errc::no_such_file_or_directory || (::kill(options.pid, 0) != 0 && errno == ESRCH))
                throw Error("no process " + std::to_string(options.pid) + " (it exited)", ExitCode::not_found);
            throw Error("cannot read the executable of process " + std::to_string(options.pid), ExitCode::permission);
        }
        sources.push_back(target_view(options.pid, exe.string()));
    }
    std::vector<SelectedList> lists;
    std::size_t total = 0, selected = 0;
    for (const auto& source : sources) {
        SelectedList s{source, load_probes(source), {}};
        if (s.list.probes.empty())
            throw Error(source + ": the probe list is empty; was the binary built with iprobe-cc?", ExitCode::bad_input);
        total += s.list.probes.size();
        lists.push_back(std::move(s));
    }
    for (auto& s : lists) {
        s.selected = options.selector.select(s.list);
        selected += s.selected.size();
    }
    if (selected == 0)
        throw Error("no probe matches " + describe_selector(options.selector) + " among " + std::to_string(total) +
                        " probes; see 'iprobe list " + sources.front() + "'",
                    ExitCode::not_found);
    return lists;
}

std::string hex_id(const std::vector<std::uint8_t>& id) { return id.empty() ? "(none)" : hex(id); }

const RunningModule& match_module(const SelectedList& s, const std::vector<RunningModule>& modules, pid_t pid) {
    for (const auto& m : modules)
        if (!s.list.build_id.empty() && m.build_id == s.list.build_id) return m;
    const std::string name = basename_of(s.list.module);
    for (const auto& m : modules)
        if (basename_of(m.path) == name)
            throw Error(s.source + " was made for build-id " + s.list.build_id_hex() + " but " + m.path +
                            " running in process " + std::to_string(pid) + " has build-id " + hex_id(m.build_id) +
                            ": use the probe list of the running build",
                        ExitCode::bad_input);
    if (!(s.list.flags & IPROBE_PL_FLAG_SHARED)) {
        std::error_code ec;
        const auto exe = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec).string();
        for (const auto& m : modules)
            if (!ec && m.path == exe)
                throw Error(s.source + " describes executable " + s.list.module + " (build-id " + s.list.build_id_hex() +
                                ") but process " + std::to_string(pid) + " runs " + m.path + " (build-id " +
                                hex_id(m.build_id) + "): use the probe list of the running build",
                            ExitCode::bad_input);
    }
    throw Error("module " + s.list.module + " (build-id " + s.list.build_id_hex() + ") of " + s.source +
                    " is not loaded in process " + std::to_string(pid),
                ExitCode::not_found);
}

// Aggregate slots for a new module's probes: one per function (its entry and
// exit probes share it), one per point.
void assign_stats(Region& region, const RunningModule& running, const ProbeList& list, std::uint32_t first_probe) {
    std::uint32_t next = region.stat_count();
    std::map<std::string, std::uint32_t> by_function;
    iprobe_rt_probe* probes = region.probes();
    for (const auto& p : list.probes) {
        std::uint32_t stat;
        if (p.kind == ProbeKind::point) {
            stat = next++;
        } else {
            const std::string key = p.function_address ? std::to_string(p.function_address) : p.function;
            auto [it, fresh] = by_function.try_emplace(key, next);
            if (fresh) next++;
            stat = it->second;
        }
        if (stat >= region.stat_capacity())
            throw Error("the iprobe region of this process has no aggregate slots left for " + running.path +
                        "; restart the process to attach more modules");
        probes[first_probe + p.id].stat = stat;
    }
    __atomic_store_n(&region.control()->stat_count, next, __ATOMIC_RELEASE);
}

// An entry probe is timed (pushes a frame) only while its function's exit
// probe is enabled too: nothing else would pop the frame.
void update_timed(Region& region) {
    iprobe_rt_probe* probes = region.probes();
    const std::uint32_t count = region.probe_count();
    std::vector<std::uint8_t> exit_on(region.stat_capacity(), 0);
    for (std::uint32_t i = 0; i < count; i++)
        if (probes[i].enabled && probes[i].kind == static_cast<std::uint8_t>(ProbeKind::exit) &&
            probes[i].stat < exit_on.size())
            exit_on[probes[i].stat] = 1;
    for (std::uint32_t i = 0; i < count; i++)
        probes[i].timed = probes[i].kind == static_cast<std::uint8_t>(ProbeKind::entry) &&
                          probes[i].stat < exit_on.size() && exit_on[probes[i].stat];
}

// Every site of the list lies inside the module's executable segments, so no
// write can land outside its code (the bytes at each selected site are
// checked once the world is stopped).
void check_sites_in_code(const SelectedList& s, const RunningModule& running) {
    for (const auto& p : s.list.probes)
        if (!running.holds_code(p.site, p.size))
            throw Error(s.source + ": record " + std::to_string(p.id) + ": site_address " + hex_address(p.site) +
                            " is outside the executable segments of " + running.path +
                            "; the probe list is corrupt or not made for this build",
                        ExitCode::bad_input);
}

// Throws Error(bad_input) unless the site holds its placeholder, a call into
// one of our stubs, or (call forms) the compiler's original hook call.
void check_site_bytes(const SelectedList& s, const RunningModule& running, const Probe& p, std::uint64_t site,
                      const std::uint8_t* now, StubChecker& stubs_seen) {
    if (std::memcmp(now, p.placeholder.data(), p.size) == 0 || stubs_seen.calls_a_stub(site, now, p.size) ||
        (std::memcmp(now, p.original.data(), p.size) == 0 && p.form != SiteForm::nop))
        return;
    std::ostringstream bytes;
    for (int i = 0; i < p.size; i++) bytes << (i ? " " : "") << std::hex << int(now[i]);
    throw Error(s.source + ": record " + std::to_string(p.id) + ": site " + hex_address(site) + " in " + p.demangled +
                    " holds [" + bytes.str() + "], neither its placeholder nor an iprobe call: " + running.path +
                    " is not the coldpatched binary " + s.source + " describes",
                ExitCode::bad_input);
}

// Before anything is injected or written: every selected site lies in the
// module's code and holds what the list says.
void check_selected_sites(const ProcessMemory& memory, const SelectedList& s, const RunningModule& running) {
    check_sites_in_code(s, running);
    std::vector<std::uint64_t> addresses;
    addresses.reserve(s.selected.size());
    for (const Probe* p : s.selected) addresses.push_back(running.load_bias + p->site);
    const std::vector<SiteText> text = read_sites(memory, addresses);
    StubChecker stubs_seen(memory);
    for (std::size_t k = 0; k < s.selected.size(); k++)
        check_site_bytes(s, running, *s.selected[k], addresses[k], text[k].data(), stubs_seen);
}

std::uint32_t find_or_add_module(Region& region, const RunningModule& running, const SelectedList& s) {
    iprobe_rt_control* cb = region.control();
    iprobe_rt_module* mods = region.modules();
    for (std::uint32_t i = 0; i < region.module_count(); i++)
        if (mods[i].load_bias == running.load_bias &&
            running.path == std::string(mods[i].path, ::strnlen(mods[i].path, sizeof mods[i].path)) &&
            mods[i].probe_count == s.list.probes.size()) {
            if (mods[i].first_probe > region.probe_capacity() ||
                mods[i].probe_count > region.probe_capacity() - mods[i].first_probe)
                throw Error("the iprobe region of process has an inconsistent module table (corrupted?)",
                            ExitCode::bad_input);
            return i;
        }
    if (region.module_count() >= cb->module_capacity || cb->module_count >= cb->module_capacity)
        throw Error("too many modules attached in this process");
    if (region.probe_count() + s.list.probes.size() > region.probe_capacity())
        throw Error("the iprobe region of this process was sized for " + std::to_string(cb->probe_capacity) +
                    " probes at first attach; restart the process to attach more modules");
    const std::uint32_t index = cb->module_count;
    iprobe_rt_module& m = mods[index];
    std::memset(&m, 0, sizeof m);
    std::strncpy(m.path, running.path.c_str(), sizeof m.path - 1);
    const std::string probes_path = canonical_or_same(s.source);
    std::strncpy(m.probes_path, probes_path.c_str(), sizeof m.probes_path - 1);
    m.build_id_size = static_cast<std::uint32_t>(std::min<std::size_t>(running.build_id.size(), sizeof m.build_id));
    std::memcpy(m.build_id, running.build_id.data(), m.build_id_size);
    m.first_probe = region.probe_count();
    m.probe_count = static_cast<std::uint32_t>(s.list.probes.size());
    m.load_bias = running.load_bias;
    iprobe_rt_probe* probes = region.probes();
    for (const auto& p : s.list.probes) {
        iprobe_rt_probe& rp = probes[m.first_probe + p.id];
        rp = {};
        rp.module = index;
        rp.id = p.id;
        rp.kind = static_cast<std::uint8_t>(p.kind);
        rp.form = static_cast<std::uint8_t>(p.form);
        rp.size = p.size;
        rp.function = p.function_address <= UINT32_MAX ? static_cast<std::uint32_t>(p.function_address) : 0;
        rp.site = running.load_bias + p.site;
        rp.stat = IPROBE_RT_NO_STAT;
    }
    assign_stats(region, running, s.list, m.first_probe);
    cb->probe_count = m.first_probe + m.probe_count;
    cb->module_count = index + 1;
    return index;
}

const std::string& handler_symbol(const HandlerSymbols& h, const Probe& p) {
    const bool nop = p.form == SiteForm::nop;
    switch (p.kind) {
    case ProbeKind::entry: return nop ? h.enter_nop : h.enter;
    case ProbeKind::exit: return nop ? h.exit_nop : h.exit;
    default: return nop ? h.point_nop : h.point;
    }
}

// Where a count stub's counter lies in a thread's sums (SiteId::counter);
// past every slot for a probe without one, which the handler ignores.
std::uint32_t counter_offset(std::uint32_t stat, ProbeKind kind) {
    constexpr std::uint64_t kNone = UINT32_MAX & ~std::uint64_t{7};
    if (stat == IPROBE_RT_NO_STAT) return kNone;
    const std::uint64_t at = std::uint64_t{stat} * sizeof(iprobe_rt_fn_stats) +
                             (kind == ProbeKind::exit ? offsetof(iprobe_rt_fn_stats, completed)
                                                      : offsetof(iprobe_rt_fn_stats, calls));
    return at < kNone ? static_cast<std::uint32_t>(at) : kNone;
}

// The per-site entry point for `p`, or empty where its site takes the shared stub.
const std::string& id_symbol(const HandlerSymbols& h, const Probe& p) {
    static const std::string none;
    if (p.form == SiteForm::nop) return none;
    return p.kind == ProbeKind::entry ? h.enter_id : p.kind == ProbeKind::exit ? h.exit_id : none;
}

// The stub in the module's stub page that jumps to `target`, created if needed.
std::uint64_t stub_for(StoppedProcess& process, iprobe_rt_module& module, std::uint64_t target) {
    std::vector<std::uint8_t> page(kPage);
    process.read(module.stub_page, page.data(), page.size());
    for (std::uint32_t i = 0; i < module.stub_used; i++)
        if (stub_target(page.data() + i * kStubSize) == target) return module.stub_page + i * kStubSize;
    if (module.stub_used >= kPage / kStubSize) throw Error("stub page full");
    const auto bytes = stub_bytes(target);
    const std::uint64_t at = module.stub_page + module.stub_used * kStubSize;
    process.write(at, bytes.data(), bytes.size());
    module.stub_used++;
    return at;
}

// Maps `size` bytes of stubs, read-only and executable, where every byte of
// the module is within a rel32 call of every byte of them.
std::uint64_t map_stubs_near(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                             std::uint64_t size) {
    const auto mmap_at = libc.symbol("mmap");
    if (!mmap_at) throw Error("libc of the target has no mmap symbol", ExitCode::unavailable);
    for (int attempt = 0; attempt < 4; attempt++) {
        // Read afresh: stubs mapped a moment ago (for this or another module) are in it.
        const auto want = stub_address(read_maps(process.pid()), running.low, running.high, size);
        if (!want)
            throw Error("no free address within ±2 GiB of " + running.path + " for the jump stubs; cannot enable its probes",
                        ExitCode::unavailable);
        const std::uint64_t got =
            process.call(*mmap_at, {*want, size, PROT_READ | PROT_EXEC,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, static_cast<std::uint64_t>(-1), 0});
        if (got == *want) return got;
        if (got != static_cast<std::uint64_t>(-1) && got < 0xfffffffffffff000ull) {
            if (auto munmap_at = libc.symbol("munmap")) process.call(*munmap_at, {got, size});
        }
    }
    throw Error("could not map jump stubs near " + running.path, ExitCode::unavailable);
}

void ensure_stub_page(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                      iprobe_rt_module& module) {
    if (module.stub_page) return;
    module.stub_page = map_stubs_near(process, libc, running, kPage);
    module.stub_used = 0;
}

// One site-stub slot per probe id of the module, mapped on first use.
void ensure_site_stubs(StoppedProcess& process, const LoadedLibrary& libc, const RunningModule& running,
                       iprobe_rt_module& module) {
    if (module.site_stubs && module.site_stub_slots >= module.probe_count) return;
    const std::uint64_t bytes = (std::uint64_t{module.probe_count} * kSiteStubSize + kPage - 1) / kPage * kPage;
    module.site_stubs = map_stubs_near(process, libc, running, bytes);
    module.site_stub_slots = module.probe_count;
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
    return canonical_or_same(path);
}

struct Injected {
    LoadedLibrary library;
    bool injected = false;
};

// A target in a mount namespace of its own (a container) has no `path`: the
// library is put there, at the same path, for its dlopen.  Returns the copy
// made ("" when the target already sees the library), for removal if the
// injection fails.
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
    try {
        remote_dlopen(process, libc, path);
    } catch (...) {
        std::error_code ec;
        if (!copied.empty()) std::filesystem::remove(copied, ec);
        throw;
    }
    maps = read_maps(process.pid());
    modules = running_modules(process.memory(), maps);
    auto lib = find_loaded(process.pid(), modules, path);
    if (!lib) throw Error("dlopen of " + path + " succeeded but it is not mapped in process " + std::to_string(process.pid()));
    return {*lib, true};
}

// Runs `body` with the world stopped; a body that throws RetryLater (an
// unsafe moment) is run again after letting the target go briefly.
// While the target is stopped, this process is the only one making progress
// for it, and once it lets the first thread go, that thread must not take the
// CPU from the detaching of the others: run as a real-time task for the
// duration (root only; SCHED_FIFO at the lowest priority outranks every normal
// task, and the kernel's RT throttling still bounds it), else at nice -20.
class UrgentPriority {
public:
    UrgentPriority() {
        saved_policy_ = ::sched_getscheduler(0);
        ::sched_getparam(0, &saved_param_);
        const sched_param rt{1};
        realtime_ = saved_policy_ == SCHED_OTHER && ::sched_setscheduler(0, SCHED_FIFO, &rt) == 0;
        if (realtime_) return;
        errno = 0;
        saved_nice_ = ::getpriority(PRIO_PROCESS, 0);
        niced_ = errno == 0 && ::setpriority(PRIO_PROCESS, 0, -20) == 0;
    }
    ~UrgentPriority() {
        if (realtime_) ::sched_setscheduler(0, saved_policy_, &saved_param_);
        if (niced_) ::setpriority(PRIO_PROCESS, 0, saved_nice_);
    }
    UrgentPriority(const UrgentPriority&) = delete;
    UrgentPriority& operator=(const UrgentPriority&) = delete;

private:
    int saved_policy_ = SCHED_OTHER;
    sched_param saved_param_{};
    int saved_nice_ = 0;
    bool realtime_ = false, niced_ = false;
};

template <typename Body>
auto with_world_stopped(pid_t pid, std::chrono::milliseconds timeout, Body&& body) {
    UrgentPriority urgent;
    const auto deadline = Clock::now() + timeout;
    for (int attempt = 0;; attempt++) {
        throw_if_interrupted();
        {
            const auto started = Clock::now();
            StoppedProcess process(pid);
            process.stop_us = elapsed_us(started);
            try {
                return body(process, started, deadline);
            } catch (const RetryLater&) {
            }
        }
        if (Clock::now() > deadline)
            throw Error("process " + std::to_string(pid) + " never reached a safe point within " +
                            std::to_string(timeout.count()) + " ms (a thread kept executing a site being patched); retry",
                        ExitCode::busy);
        std::this_thread::sleep_for(std::chrono::microseconds(500 + 200 * (attempt % 10)));
    }
}

}  // namespace

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
    } else {
        h.enter_id = "iprobe_rt_trace_enter_id";
        h.exit_id = "iprobe_rt_trace_exit_id";
        h.site_id = SiteId::probe;
    }
    return h;
}

std::string default_runtime_library() {
    if (const char* env = std::getenv("IPROBE_RUNTIME"); env && *env) return env;
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        // build/libexec/iprobe/tool, build/bin/tool, build/tests/x -> build/lib
        for (auto dir = self.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
            const auto candidate = dir / "lib" / kRuntimeName;
            if (std::filesystem::exists(candidate, ec)) return candidate.string();
        }
    }
    return std::string("/usr/local/lib/") + kRuntimeName;
}

AttachStats attach(const AttachOptions& options) {
    check_target(options.pid);
    target_owner(options.pid);  // not_found when it is gone
    std::vector<SelectedList> lists = load_lists(options);
    const HandlerSymbols handlers = resolve_handlers(options);
    const std::string runtime_path = runtime_path_of(options);
    const std::string handler_path = handlers.library.empty() ? runtime_path : canonical_or_same(handlers.library);
    SessionLock lock(options.pid);
    for (const auto& m : read_maps(options.pid))
        if (basename_of(m.path).rfind("libc.so", 0) == 0 || basename_of(m.path) == kRuntimeName)
            elf_cache().preload(options.pid, m.path);
    elf_cache().preload(options.pid, runtime_path);
    elf_cache().preload(options.pid, handler_path);
    const auto before = runtime_state(options.pid);
    const TscCalibration tsc = before && before->control ? TscCalibration{} : calibrate_tsc();

    std::uint32_t capacity = 4096;
    for (auto& s : lists) capacity += static_cast<std::uint32_t>(s.list.probes.size()) * 2;

    return with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                            Clock::time_point started,
                                                                            Clock::time_point deadline) {
        AttachStats stats;
        stats.threads = process.threads().size();
        auto maps = read_maps(options.pid);
        auto modules = running_modules(process.memory(), maps);
        std::vector<const RunningModule*> targets;
        for (auto& s : lists) targets.push_back(&match_module(s, modules, options.pid));
        for (std::size_t li = 0; li < lists.size(); li++) check_selected_sites(process.memory(), lists[li], *targets[li]);
        const LoadedLibrary libc = libc_of(options.pid, modules);

        Injected runtime = ensure_library(process, maps, modules, libc, runtime_path, deadline);
        Injected handler_lib = handler_path == runtime_path
                                   ? runtime
                                   : ensure_library(process, maps, modules, libc, handler_path, deadline);
        stats.runtime_injected = runtime.injected;
        stats.handler_injected = handler_lib.injected && handler_path != runtime_path;
        // Modules may have moved in `modules` after an injection: re-match.
        targets.clear();
        for (auto& s : lists) targets.push_back(&match_module(s, modules, options.pid));

        const auto state_at = runtime.library.symbol("iprobe_rt_state");
        const auto map_at = runtime.library.symbol("iprobe_rt_map_region");
        if (!state_at || !map_at) throw Error(runtime.library.path + " is not the iprobe runtime", ExitCode::bad_input);
        auto state = process.read_value<struct iprobe_rt_state>(*state_at);
        if (std::memcmp(state.magic, IPROBE_RT_STATE_MAGIC, 8) != 0)
            throw Error(runtime.library.path + " in process " + std::to_string(options.pid) + " has an unknown layout",
                        ExitCode::bad_input);

        Region region;
        std::int64_t fresh_fd = -1;  // the new region's descriptor inside the target
        const pid_t own_pid = pid_in_own_namespace(options.pid);
        std::optional<Region> existing;
        if (state.control != 0 && state.mapped_pid == static_cast<std::uint32_t>(own_pid))
            existing = Region::try_open(options.pid);
        if (!existing) {
            RegionGeometry g;
            g.probe_capacity = capacity;
            g.ring_records = options.ring_records;
            g.thread_count = options.max_threads;
            iprobe_rt_control layout = region_layout(g, tsc.hz ? tsc : calibrate_tsc());
            layout.owner_pid = static_cast<std::uint32_t>(own_pid);
            const auto create_at = runtime.library.symbol("iprobe_rt_create_region");
            if (!create_at) throw Error(runtime.library.path + " is not the iprobe runtime of this version", ExitCode::bad_input);
            fresh_fd = static_cast<std::int64_t>(process.call(*create_at, {layout.region_size}));
            if (fresh_fd < 0)
                throw Error("the runtime in process " + std::to_string(options.pid) + " could not create its region: " +
                            std::strerror(static_cast<int>(-fresh_fd)));
            UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, options.pid, 0)));
            UniqueFd fd(pidfd ? static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), static_cast<int>(fresh_fd), 0)) : -1);
            if (!fd) throw_errno("cannot take the new iprobe region of process " + std::to_string(options.pid));
            region = Region::create(std::move(fd), layout);
        } else {
            region = std::move(*existing);
        }
        std::vector<Patch> patches;
        StubChecker stubs_seen(process.memory());
        struct Enable {
            std::uint32_t global;
            std::uint64_t return_address;
        };
        std::vector<Enable> enables;
        std::set<std::string> touched;
        struct SiteStub {
            std::uint64_t address;
            std::array<std::uint8_t, kSiteStubSize> bytes;
        };
        std::vector<SiteStub> site_stubs;

        for (std::size_t li = 0; li < lists.size(); li++) {
            auto& s = lists[li];
            const RunningModule& running = *targets[li];
            const std::uint32_t mi = find_or_add_module(region, running, s);
            iprobe_rt_module& module = region.modules()[mi];
            touched.insert(running.path);
            if (s.selected.empty()) continue;
            std::vector<std::uint64_t> addresses;
            addresses.reserve(s.selected.size());
            for (const Probe* p : s.selected) addresses.push_back(running.load_bias + p->site);
            const std::vector<SiteText> text = read_sites(process.memory(), addresses);
            ensure_stub_page(process, libc, running, module);
            // Keyed by the handler symbol's identity: one of the six in `handlers`.
            std::map<const std::string*, std::uint64_t> stubs;
            auto handler_address = [&](const std::string& symbol) {
                const auto target = handler_lib.library.symbol(symbol);
                if (!target) throw Error(handler_lib.library.path + " has no symbol " + symbol, ExitCode::bad_input);
                return *target;
            };
            patches.reserve(patches.size() + s.selected.size());
            enables.reserve(enables.size() + s.selected.size());
            for (std::size_t k = 0; k < s.selected.size(); k++) {
                const Probe* p = s.selected[k];
                const std::uint64_t site = addresses[k];
                const std::uint8_t* now = text[k].data();
                const std::uint32_t global = module.first_probe + p->id;
                const std::uint64_t ret = site + p->size;
                stats.selected++;
                if (std::memcmp(now, p->placeholder.data(), p->size) == 0) {
                    const std::string& symbol = handler_symbol(handlers, *p);
                    if (symbol.empty())
                        throw Error("the handler library has no entry point for " + std::string(to_string(p->kind)) +
                                        (p->form == SiteForm::nop ? " NOP-form" : "") + " sites (" + p->demangled + ")",
                                    ExitCode::unavailable);
                    std::uint64_t callee = 0;
                    if (const std::string& by_id = id_symbol(handlers, *p); !by_id.empty()) {
                        ensure_site_stubs(process, libc, running, module);
                        const std::uint32_t id = handlers.site_id == HandlerSymbols::SiteId::counter
                                                     ? counter_offset(region.probes()[global].stat, p->kind)
                                                     : global;
                        callee = module.site_stubs + kSiteStubSize * p->id;
                        const bool inline_count = handlers.site_id == HandlerSymbols::SiteId::counter &&
                                                  state.stats_tpoff != 0 && state.stats_tpoff >= INT32_MIN &&
                                                  state.stats_tpoff < 0 && id <= INT32_MAX;
                        site_stubs.push_back(
                            {callee, inline_count ? count_stub_bytes(static_cast<std::int32_t>(state.stats_tpoff), id,
                                                                     handler_address(by_id))
                                                  : site_stub_bytes(id, handler_address(by_id))});
                    } else {
                        auto& stub = stubs[&symbol];
                        if (!stub) stub = stub_for(process, module, handler_address(symbol));
                        callee = stub;
                    }
                    patches.push_back({site, SiteBytes(now, p->size), call_bytes(site, p->size, callee)});
                    enables.push_back({global, ret});
                } else {
                    // Enabled already, or a live compiler hook (binary not
                    // coldpatched, hooks served by a linked runtime): register
                    // the site, write nothing.
                    check_site_bytes(s, running, *p, site, now, stubs_seen);
                    stats.already_enabled++;
                    enables.push_back({global, ret});
                }
            }
        }
        sort_by_address(patches);
        if (!unsafe_pcs(process, patches).empty()) throw RetryLater{};
        throw_if_interrupted();

        // A stub is rewritten only while its site is a NOP, but a thread
        // may still be inside it from before a detach: wait until none is.
        std::array<std::uint8_t, kSiteStubSize> current;
        for (const SiteStub& stub : site_stubs) {
            process.read(stub.address, current.data(), current.size());
            if (current == stub.bytes) continue;
            for (const auto& t : process.threads())
                if (t.regs.rip >= stub.address && t.regs.rip < stub.address + kSiteStubSize) throw RetryLater{};
            process.write(stub.address, stub.bytes.data(), stub.bytes.size());
        }

        // Table first, code second: a site only becomes live once its
        // return address resolves.
        for (const auto& e : enables) region.insert_site(e.return_address, e.global, region.probes()[e.global].stat);
        if (fresh_fd >= 0) {
            const auto rc = static_cast<std::int64_t>(process.call(*map_at, {static_cast<std::uint64_t>(fresh_fd)}));
            if (rc != 0)
                throw Error("the runtime in process " + std::to_string(options.pid) + " could not map its region: " +
                            std::strerror(static_cast<int>(-rc)));
        }
        apply_patches(process, patches);
        for (const auto& e : enables) region.probes()[e.global].enabled = 1;
        update_timed(region);
        region.control()->generation++;
        stats.enabled = patches.size();
        for (std::uint32_t i = 0; i < region.probe_count(); i++) stats.total_enabled += region.probes()[i].enabled;
        stats.modules.assign(touched.begin(), touched.end());
        stats.stop_us = process.stop_us;
        process.release();
        stats.pause_us = elapsed_us(started);
        return stats;
    });
}

DetachStats detach(const DetachOptions& options) {
    check_target(options.pid);
    SessionLock lock(options.pid);
    Region region = Region::open(options.pid);
    ProcessMemory memory(options.pid);
    // Sites, lists and stubs come from the process's maps and code, never
    // from its region (see live_sites.hpp).  Planned while the target runs:
    // only we rewrite its sites, under the session lock, and apply_patches()
    // checks every site again once it is stopped.
    const std::vector<AttachedModule> modules = attached_modules(options.pid, region, memory);
    StubChecker stubs(memory);
    std::vector<Patch> patches;
    std::vector<std::uint32_t> flags_off;  // region probe flags to clear
    std::vector<std::pair<const AttachedModule*, std::size_t>> selected;
    for (const AttachedModule& m : modules) {
        const iprobe_rt_module& rm = region.modules()[m.region_index];
        const bool ids_match = m.list.probes.size() == rm.probe_count && rm.first_probe <= region.probe_capacity() &&
                               rm.probe_count <= region.probe_capacity() - rm.first_probe;
        std::vector<std::uint64_t> addresses;
        std::vector<std::size_t> which;
        for (std::size_t k = 0; k < m.list.probes.size(); k++)
            if (m.sites[k] && options.selector.matches(m.list.probes[k])) {
                addresses.push_back(m.sites[k]);
                which.push_back(k);
            }
        const std::vector<SiteText> text = read_sites(memory, addresses);
        for (std::size_t j = 0; j < which.size(); j++) {
            const Probe& p = m.list.probes[which[j]];
            selected.emplace_back(&m, which[j]);
            if (ids_match && p.id < rm.probe_count) flags_off.push_back(rm.first_probe + p.id);
            if (site_state(p, addresses[j], text[j], stubs) != SiteState::live) continue;
            patches.push_back({addresses[j], SiteBytes(text[j].data(), p.size), SiteBytes(p.placeholder.data(), p.size)});
        }
    }
    sort_by_address(patches);

    DetachStats stats = with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                                       Clock::time_point started,
                                                                                       Clock::time_point) {
        DetachStats st;
        st.threads = process.threads().size();
        if (!unsafe_pcs(process, patches).empty()) throw RetryLater{};
        throw_if_interrupted();
        apply_patches(process, patches);
        iprobe_rt_probe* probes = region.probes();
        for (auto g : flags_off) probes[g].enabled = 0;
        update_timed(region);
        region.control()->generation++;
        st.stop_us = process.stop_us;
        process.release();
        st.pause_us = elapsed_us(started);
        st.disabled = patches.size();
        return st;
    });
    // What detach reports is what the code now holds, read back site by site.
    StubChecker stubs_after(memory);
    std::vector<std::vector<SiteState>> states;
    for (const AttachedModule& m : modules) {
        states.push_back(site_states(m, memory, stubs_after));
        for (SiteState state : states.back()) stats.still_enabled += state == SiteState::live;
    }
    for (const auto& [m, k] : selected)
        stats.not_restored += states[static_cast<std::size_t>(m - modules.data())][k] == SiteState::live;
    return stats;
}

Status status(pid_t pid) {
    check_target(pid);
    Status st;
    st.pid = pid;
    for (const auto& m : read_maps(pid))
        if (basename_of(m.path) == kRuntimeName) {
            st.runtime_loaded = true;
            st.runtime_path = m.path;
        }
    auto opened = Region::try_open(pid);
    if (!opened) return st;
    Region& region = *opened;
    st.region = true;
    const auto* cb = region.control();
    st.ring_records = region.ring_records();
    st.ring_count = region.ring_count();
    st.no_ring_events = cb->no_ring_events;
    st.no_slot_events = cb->no_slot_events;
    st.unknown_site_events = cb->unknown_site_events;
    st.region_bytes = region.size();
    for (std::uint32_t i = 0; i < region.module_count(); i++) {
        const auto& m = region.modules()[i];
        ModuleStatus ms;
        ms.path.assign(m.path, ::strnlen(m.path, sizeof m.path));
        ms.probes_path.assign(m.probes_path, ::strnlen(m.probes_path, sizeof m.probes_path));
        ms.build_id = hex(std::span<const std::uint8_t>(m.build_id, m.build_id_size));
        ms.load_bias = m.load_bias;
        ms.stub_page = m.stub_page;
        ms.probes = m.probe_count;
        if (m.first_probe <= region.probe_capacity() && m.probe_count <= region.probe_capacity() - m.first_probe)
            for (std::uint32_t p = 0; p < m.probe_count; p++) ms.enabled += region.probes()[m.first_probe + p].enabled;
        st.modules.push_back(ms);
    }
    try {
        const ProcessMemory memory(pid);
        StubChecker stubs(memory);
        for (const AttachedModule& m : attached_modules(pid, region, memory)) {
            ModuleStatus& ms = st.modules[m.region_index];
            ms.live = 0;
            for (SiteState state : site_states(m, memory, stubs)) {
                ms.live += state == SiteState::live;
                ms.foreign += state == SiteState::other;
            }
        }
    } catch (const Error& e) {
        st.sites_unread = e.what();
    }
    for (std::uint32_t i = 0; i < region.thread_count(); i++)
        if (__atomic_load_n(&region.thread(i)->state, __ATOMIC_ACQUIRE) != IPROBE_RT_RING_FREE) st.threads++;
    for (std::uint32_t i = 0; i < region.ring_count(); i++) {
        const auto* r = region.ring(i);
        const std::uint32_t state = __atomic_load_n(&r->state, __ATOMIC_ACQUIRE);
        st.dropped += r->dropped;
        if (state == IPROBE_RT_RING_FREE) continue;
        RingStatus rs;
        rs.index = i;
        rs.tid = r->tid;
        rs.state = state == IPROBE_RT_RING_OWNED ? "owned" : "retired";
        const std::uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
        rs.pending = head > r->tail ? head - r->tail : 0;
        rs.dropped = r->dropped;
        st.rings.push_back(rs);
    }
    return st;
}

}  // namespace iprobe::hotpatch
