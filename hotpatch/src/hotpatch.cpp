#include "iprobe/hotpatch.hpp"

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

#include "iprobe/elf_file.hpp"
#include "iprobe/probe_source.hpp"
#include "iprobe/rt.h"
#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"
#include "iprobe/support/lock_file.h"
#include "modules.hpp"
#include "process.hpp"
#include "region.hpp"

namespace iprobe::hotpatch {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kPage = 4096;
constexpr std::size_t kStubSize = 16;
constexpr std::int64_t kReach = (1ll << 31) - 2 * static_cast<std::int64_t>(kPage);
constexpr const char* kRuntimeName = "libiprobe-rt.so";

std::string hex_address(std::uint64_t v) {
    std::ostringstream s;
    s << "0x" << std::hex << v;
    return s.str();
}

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
    std::shared_ptr<ElfFile> elf;

    std::optional<std::uint64_t> symbol(const std::string& name) const {
        const ElfSymbol* s = elf->symbol_named(name);
        if (!s || !s->defined()) return std::nullopt;
        return bias + s->address;
    }
};

// ELF files parsed before the world stops: parsing libc takes milliseconds.
class ElfCache {
public:
    std::shared_ptr<ElfFile> get(pid_t pid, const std::string& mapped_path) {
        auto& slot = files_[mapped_path];
        if (!slot) slot = std::make_shared<ElfFile>(target_view(pid, mapped_path));
        return slot;
    }
    void preload(pid_t pid, const std::string& mapped_path) {
        try {
            get(pid, mapped_path);
        } catch (const Error&) {
        }
    }

private:
    std::map<std::string, std::shared_ptr<ElfFile>> files_;
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
        const ElfSymbol* s = libc.elf->symbol_named(name);
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
std::optional<std::uint64_t> stub_address(const std::vector<Mapping>& maps, std::uint64_t low, std::uint64_t high) {
    std::optional<std::uint64_t> best;
    std::uint64_t best_distance = ~0ull;
    std::uint64_t prev_end = 0x10000;
    std::string prev_path;
    auto consider = [&](std::uint64_t gap_low, std::uint64_t gap_high, bool after_heap) {
        if (gap_high <= gap_low || gap_high - gap_low < kPage) return;
        std::uint64_t candidate;
        if (gap_high <= low) candidate = gap_high - kPage;
        else if (after_heap) candidate = gap_high - kPage;
        else candidate = gap_low;
        const std::int64_t far = static_cast<std::int64_t>(std::max(
            candidate > low ? candidate + kPage - low : high - candidate, high > candidate ? high - candidate : candidate + kPage - low));
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

std::array<std::uint8_t, kStubSize> stub_bytes(std::uint64_t target) {
    // jmp *2(%rip); int3 int3; .quad target
    std::array<std::uint8_t, kStubSize> b{0xff, 0x25, 0x02, 0x00, 0x00, 0x00, 0xcc, 0xcc};
    std::memcpy(b.data() + 8, &target, 8);
    return b;
}

std::uint64_t stub_target(const std::uint8_t* stub) {
    std::uint64_t target = 0;
    if (stub[0] == 0xff && stub[1] == 0x25 && stub[2] == 0x02) std::memcpy(&target, stub + 8, 8);
    return target;
}

// The few bytes of one site, kept inline: a 10k-probe attach builds 10k of
// these while the target is stopped, so no heap allocation per site.
struct SiteBytes {
    std::array<std::uint8_t, IPROBE_PL_SITE_MAX> bytes{};
    std::uint8_t size = 0;

    SiteBytes() = default;
    SiteBytes(const std::uint8_t* from, std::uint8_t n) : size(n) { std::memcpy(bytes.data(), from, n); }
    const std::uint8_t* begin() const { return bytes.data(); }
    const std::uint8_t* end() const { return bytes.data() + size; }
};

// The bytes an enabled site holds: call rel32 to the stub; a 6-byte site
// gets its 1-byte NOP first so the call returns to the site's end, which is
// an instruction boundary in both forms.
SiteBytes call_bytes(std::uint64_t site, std::uint8_t size, std::uint64_t stub) {
    const std::uint64_t call_at = size == 6 ? site + 1 : site;
    const std::int64_t rel = static_cast<std::int64_t>(stub) - static_cast<std::int64_t>(call_at + 5);
    if (rel < INT32_MIN || rel > INT32_MAX)
        throw Error("stub at " + hex_address(stub) + " is out of call rel32 reach of site " + hex_address(site));
    const auto rel32 = static_cast<std::uint32_t>(static_cast<std::int32_t>(rel));
    SiteBytes b;
    b.size = size == 6 ? 6 : 5;
    std::size_t at = 0;
    if (size == 6) b.bytes[at++] = 0x90;
    b.bytes[at++] = 0xe8;
    for (int i = 0; i < 4; i++) b.bytes[at++] = static_cast<std::uint8_t>(rel32 >> (8 * i));
    return b;
}

// Where a call-form site placed by call_bytes() leads, or 0.
std::uint64_t called_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size) {
    std::size_t at = 0;
    if (size == 6) {
        if (bytes[0] != 0x90) return 0;
        at = 1;
    }
    if (bytes[at] != 0xe8) return 0;
    std::int32_t rel;
    std::memcpy(&rel, bytes + at + 1, 4);
    return site + at + 5 + static_cast<std::int64_t>(rel);
}

// Does a site call into one of our jump stubs (ours, or one inherited from a
// parent process across fork)?  Stubs are few: each is read once.
class StubChecker {
public:
    explicit StubChecker(const ProcessMemory& memory) : memory_(memory) {}
    bool calls_a_stub(std::uint64_t site, const std::uint8_t* bytes, std::uint8_t size) {
        const std::uint64_t target = called_stub(site, bytes, size);
        if (target == 0) return false;
        auto [it, fresh] = known_.try_emplace(target, false);
        if (fresh) {
            std::uint8_t stub[kStubSize];
            try {
                memory_.read(target, stub, sizeof stub);
                it->second = stub_target(stub) != 0;
            } catch (const Error&) {
            }
        }
        return it->second;
    }

private:
    const ProcessMemory& memory_;
    std::map<std::uint64_t, bool> known_;
};

struct Patch {
    std::uint64_t address = 0;
    SiteBytes before, after;
};

void sort_by_address(std::vector<Patch>& patches) {
    std::sort(patches.begin(), patches.end(), [](auto& a, auto& b) { return a.address < b.address; });
}

using SiteText = std::array<std::uint8_t, IPROBE_PL_SITE_MAX>;

// The bytes at each address.  Sites close together share one read; far
// apart ones are read apart, so no buffer ever spans the gap between the
// lowest and the highest site (a bad address costs one failed read, not a
// gigabyte).
std::vector<SiteText> read_sites(const ProcessMemory& memory, const std::vector<std::uint64_t>& addresses) {
    std::vector<std::size_t> order(addresses.size());
    for (std::size_t i = 0; i < order.size(); i++) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return addresses[a] < addresses[b]; });
    std::vector<SiteText> out(addresses.size());
    std::vector<std::uint8_t> run;
    for (std::size_t i = 0; i < order.size();) {
        const std::uint64_t low = addresses[order[i]];
        std::uint64_t high = low + IPROBE_PL_SITE_MAX;
        std::size_t j = i + 1;
        while (j < order.size() && addresses[order[j]] < high + kPage) high = addresses[order[j++]] + IPROBE_PL_SITE_MAX;
        run.resize(high - low);
        memory.read(low, run.data(), run.size());
        for (std::size_t k = i; k < j; k++)
            std::memcpy(out[order[k]].data(), run.data() + (addresses[order[k]] - low), IPROBE_PL_SITE_MAX);
        i = j;
    }
    return out;
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

void ensure_stub_page(StoppedProcess& process, const std::vector<Mapping>& maps, const LoadedLibrary& libc,
                      const RunningModule& running, iprobe_rt_module& module) {
    if (module.stub_page) return;
    const auto mmap_at = libc.symbol("mmap");
    if (!mmap_at) throw Error("libc of the target has no mmap symbol", ExitCode::unavailable);
    for (int attempt = 0; attempt < 4; attempt++) {
        const auto want = stub_address(maps, running.low, running.high);
        if (!want)
            throw Error("no free address within ±2 GiB of " + running.path + " for the jump stubs; cannot enable its probes",
                        ExitCode::unavailable);
        const std::uint64_t got =
            process.call(*mmap_at, {*want, kPage, PROT_READ | PROT_EXEC,
                                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, static_cast<std::uint64_t>(-1), 0});
        if (got == *want) {
            module.stub_page = got;
            module.stub_used = 0;
            return;
        }
        if (got != static_cast<std::uint64_t>(-1) && got < 0xfffffffffffff000ull) {
            if (auto munmap_at = libc.symbol("munmap")) process.call(*munmap_at, {got, kPage});
        }
    }
    throw Error("could not map a jump-stub page near " + running.path, ExitCode::unavailable);
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
        throw std::runtime_error("retry");
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
    modules = running_modules(process, maps);
    auto lib = find_loaded(process.pid(), modules, path);
    if (!lib) throw Error("dlopen of " + path + " succeeded but it is not mapped in process " + std::to_string(process.pid()));
    return {*lib, true};
}

// Runs `body` with the world stopped; a body that throws std::runtime_error
// "retry" (an unsafe moment) is run again after letting the target go briefly.
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
            } catch (const Error&) {
                throw;
            } catch (const std::runtime_error& e) {
                if (std::string_view(e.what()) != "retry") throw;
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
    return {"", "iprobe_rt_" + m + "_enter", "iprobe_rt_" + m + "_exit", "iprobe_rt_" + m + "_point",
            "iprobe_rt_" + m + "_enter_nop", "iprobe_rt_" + m + "_exit_nop", "iprobe_rt_" + m + "_point_nop"};
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
        auto modules = running_modules(process, maps);
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
            ensure_stub_page(process, maps, libc, running, module);
            // Keyed by the handler symbol's identity: one of the six in `handlers`.
            std::map<const std::string*, std::uint64_t> stubs;
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
                    auto& stub = stubs[&symbol];
                    if (!stub) {
                        const auto target = handler_lib.library.symbol(symbol);
                        if (!target)
                            throw Error(handler_lib.library.path + " has no symbol " + symbol, ExitCode::bad_input);
                        stub = stub_for(process, module, *target);
                    }
                    patches.push_back({site, SiteBytes(now, p->size), call_bytes(site, p->size, stub)});
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
        if (!unsafe_pcs(process, patches).empty()) throw std::runtime_error("retry");
        throw_if_interrupted();

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
    // Probe lists by module, to match the selector against names.
    std::vector<ProbeList> lists;
    const std::uint32_t module_count = region.module_count();
    for (std::uint32_t i = 0; i < module_count; i++) {
        const auto& m = region.modules()[i];
        auto list = module_probe_list(m);
        if (!list)
            throw Error("cannot read the probe list " + std::string(m.probes_path, ::strnlen(m.probes_path, sizeof m.probes_path)) +
                            " of " + std::string(m.path, ::strnlen(m.path, sizeof m.path)) +
                            " (moved, replaced or not a regular file); nothing was detached",
                        ExitCode::not_found);
        if (m.first_probe > region.probe_capacity() || m.probe_count > region.probe_capacity() - m.first_probe)
            throw Error("the iprobe region of process " + std::to_string(options.pid) +
                            " has an inconsistent module table (corrupted?)",
                        ExitCode::bad_input);
        lists.push_back(std::move(*list));
    }

    // Planned while the target runs (only we rewrite its sites, under the
    // session lock); apply_patches() checks every site again once stopped.
    ProcessMemory memory(options.pid);
    std::vector<Patch> patches;
    std::vector<std::uint32_t> disabled;
    StubChecker stubs_seen(memory);
    iprobe_rt_probe* probes = region.probes();
    for (std::uint32_t mi = 0; mi < module_count; mi++) {
        const iprobe_rt_module& module = region.modules()[mi];
        if (lists[mi].probes.size() != module.probe_count || module.first_probe > region.probe_count() ||
            module.probe_count > region.probe_count() - module.first_probe)
            throw Error("the probe list of " + std::string(module.path, ::strnlen(module.path, sizeof module.path)) +
                            " no longer matches what was attached (" + std::to_string(lists[mi].probes.size()) +
                            " probes, " + std::to_string(module.probe_count) + " attached); nothing was changed",
                        ExitCode::bad_input);
        std::vector<const Probe*> chosen;
        std::vector<std::uint64_t> addresses;
        for (const auto& p : lists[mi].probes) {
            if (p.id >= module.probe_count) continue;
            const std::uint32_t global = module.first_probe + p.id;
            if (!probes[global].enabled || !options.selector.matches(p)) continue;
            chosen.push_back(&p);
            addresses.push_back(probes[global].site);
        }
        if (chosen.empty()) continue;
        const std::vector<SiteText> text = read_sites(memory, addresses);
        for (std::size_t k = 0; k < chosen.size(); k++) {
            const Probe* p = chosen[k];
            const std::uint32_t global = module.first_probe + p->id;
            const std::uint64_t site = addresses[k];
            const std::uint8_t* now = text[k].data();
            disabled.push_back(global);
            if (std::memcmp(now, p->placeholder.data(), p->size) == 0) continue;
            if (!stubs_seen.calls_a_stub(site, now, p->size)) continue;  // a live hook: nothing written
            patches.push_back({site, SiteBytes(now, p->size), SiteBytes(p->placeholder.data(), p->size)});
        }
    }
    sort_by_address(patches);

    return with_world_stopped(options.pid, options.safe_point_timeout, [&](StoppedProcess& process,
                                                                            Clock::time_point started,
                                                                            Clock::time_point) {
        DetachStats stats;
        stats.threads = process.threads().size();
        if (!unsafe_pcs(process, patches).empty()) throw std::runtime_error("retry");
        throw_if_interrupted();
        apply_patches(process, patches);
        for (auto g : disabled) probes[g].enabled = 0;
        update_timed(region);
        region.control()->generation++;
        stats.stop_us = process.stop_us;
        process.release();
        stats.pause_us = elapsed_us(started);
        stats.disabled = disabled.size();
        for (std::uint32_t i = 0; i < region.probe_count(); i++) stats.still_enabled += probes[i].enabled;
        return stats;
    });
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
