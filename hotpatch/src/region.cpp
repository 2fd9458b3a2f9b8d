#include "region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

#include "iprobe/elf/elf_file.h"
#include "iprobe/probelist/probe_source.h"
#include "iprobe/probelist/site_section.h"
#include "iprobe/probelist/symbol_probes.h"
#include "iprobe/support/error.h"
#include "modules.h"
#include "process.h"

namespace iprobe::hotpatch {

namespace {

constexpr std::uint64_t kPage = 4096;
// Far above any region we create (a few GiB of sparse address space).
constexpr std::uint64_t kMaxRegion = 1ull << 40;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

std::uint64_t now_ns(clockid_t clock) {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

template <typename T>
T* at(iprobe_rt_control* cb, std::uint64_t offset) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(cb) + offset);
}

// Is every offset, capacity and stride of `cb` inside a region of `size` bytes?
bool sound_layout(const iprobe_rt_control& cb, std::uint64_t size) {
    auto fits = [size](std::uint64_t offset, std::uint64_t count, std::uint64_t each) {
        return offset <= size && count <= (size - offset) / (each ? each : 1);
    };
    return cb.header_size == sizeof(iprobe_rt_control) && cb.region_size == size && cb.hash_bits >= 4 &&
           cb.hash_bits < 40 && cb.ring_records != 0 && (cb.ring_records & (cb.ring_records - 1)) == 0 &&
           cb.ring_records <= (1u << 30) &&
           cb.ring_stride >= sizeof(iprobe_rt_ring) + sizeof(iprobe_rt_record) * std::uint64_t{cb.ring_records} &&
           cb.thread_header_size >= sizeof(iprobe_rt_thread) && cb.thread_header_size % 8 == 0 &&
           cb.thread_stride >= cb.thread_header_size + sizeof(iprobe_rt_fn_stats) * std::uint64_t{cb.stat_capacity} &&
           fits(cb.modules_offset, cb.module_capacity, sizeof(iprobe_rt_module)) &&
           fits(cb.probes_offset, cb.probe_capacity, sizeof(iprobe_rt_probe)) &&
           fits(cb.hash_offset, 1ull << cb.hash_bits, sizeof(iprobe_rt_site)) &&
           fits(cb.baseline_offset, cb.stat_capacity, sizeof(iprobe_rt_fn_stats)) &&
           fits(cb.conditions_offset, cb.condition_capacity, sizeof(iprobe_cond_program)) &&
           cb.condition_capacity <= 0xffff && cb.conditions_offset % 8 == 0 &&
           (cb.exit_marks_offset == 0 ||
            (fits(cb.exit_marks_offset, cb.thread_count, sizeof(iprobe_rt_exit_marks)) && cb.exit_marks_offset % 8 == 0)) &&
           fits(cb.threads_offset, cb.thread_count, cb.thread_stride) &&
           fits(cb.rings_offset, cb.ring_count, cb.ring_stride) && cb.modules_offset % 8 == 0 &&
           cb.probes_offset % 8 == 0 && cb.hash_offset % 8 == 0 && cb.baseline_offset % 8 == 0 &&
           cb.threads_offset % 8 == 0 && cb.thread_stride % 8 == 0 && cb.rings_offset % 8 == 0 &&
           cb.ring_stride % 8 == 0;
}

}  // namespace

// The TSC is invariant on the machines we support (constant_tsc): one
// calibration against CLOCK_MONOTONIC serves every process.
namespace {

bool invariant_tsc() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line))
        if (line.rfind("flags", 0) == 0) {
            const std::string flags = line + " ";
            return flags.find(" constant_tsc ") != std::string::npos && flags.find(" nonstop_tsc ") != std::string::npos;
        }
    return false;
}

}  // namespace

TscCalibration calibrate_tsc() {
    if (const char* clock = std::getenv("IPROBE_CLOCK"); (clock && std::string(clock) == "monotonic") || !invariant_tsc()) {
        TscCalibration c;
        c.monotonic = true;
        c.hz = 1000000000ull;
        c.tsc_base = now_ns(CLOCK_MONOTONIC);
        c.realtime_ns_base = now_ns(CLOCK_REALTIME);
        return c;
    }
    const std::uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    const std::uint64_t c0 = __builtin_ia32_rdtsc();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const std::uint64_t c1 = __builtin_ia32_rdtsc();
    const std::uint64_t t1 = now_ns(CLOCK_MONOTONIC);
    TscCalibration c;
    c.hz = static_cast<std::uint64_t>(static_cast<double>(c1 - c0) * 1e9 / static_cast<double>(t1 - t0));
    c.tsc_base = __builtin_ia32_rdtsc();
    c.realtime_ns_base = now_ns(CLOCK_REALTIME);
    return c;
}

iprobe_rt_control region_layout(const RegionGeometry& g, const TscCalibration& tsc) {
    if (g.ring_records == 0 || (g.ring_records & (g.ring_records - 1)) != 0 || g.ring_records > (1u << 30))
        throw Error("ring size must be a power of two (records per thread)", ExitCode::usage);
    std::uint32_t hash_bits = 4;
    while ((1ull << hash_bits) < 2ull * g.probe_capacity) hash_bits++;

    iprobe_rt_control cb{};
    std::memcpy(cb.magic, IPROBE_RT_MAGIC, 8);
    cb.version = IPROBE_RT_VERSION;
    cb.header_size = sizeof cb;
    std::uint64_t at = round_up(sizeof cb, kPage);
    cb.modules_offset = at;
    cb.module_capacity = g.module_capacity;
    at = round_up(at + sizeof(iprobe_rt_module) * g.module_capacity, kPage);
    cb.probes_offset = at;
    cb.probe_capacity = g.probe_capacity;
    at = round_up(at + sizeof(iprobe_rt_probe) * g.probe_capacity, kPage);
    cb.hash_offset = at;
    cb.hash_bits = hash_bits;
    at = round_up(at + sizeof(iprobe_rt_site) * (1ull << hash_bits), kPage);
    // One aggregate slot per function at most; entry and exit share one.
    cb.stat_capacity = g.probe_capacity;
    cb.baseline_offset = at;
    at = round_up(at + sizeof(iprobe_rt_fn_stats) * cb.stat_capacity, kPage);
    cb.conditions_offset = at;
    cb.condition_capacity = IPROBE_RT_CONDITIONS;
    at = round_up(at + sizeof(iprobe_cond_program) * cb.condition_capacity, kPage);
    cb.exit_marks_offset = at;
    at = round_up(at + sizeof(iprobe_rt_exit_marks) * g.thread_count, kPage);
    cb.threads_offset = at;
    cb.thread_count = g.thread_count;
    cb.thread_header_size = static_cast<std::uint32_t>(round_up(sizeof(iprobe_rt_thread), IPROBE_RT_CACHELINE));
    cb.thread_stride = round_up(cb.thread_header_size + sizeof(iprobe_rt_fn_stats) * cb.stat_capacity, kPage);
    at += cb.thread_stride * g.thread_count;
    cb.rings_offset = at;
    cb.ring_count = g.thread_count;
    cb.ring_records = g.ring_records;
    cb.ring_stride = round_up(sizeof(iprobe_rt_ring) + sizeof(iprobe_rt_record) * g.ring_records, kPage);
    at += cb.ring_stride * cb.ring_count;
    if (at > kMaxRegion)
        throw Error("a region for " + std::to_string(g.probe_capacity) + " probes, " + std::to_string(g.thread_count) +
                        " thread slots and rings of " + std::to_string(g.ring_records) + " records would be " +
                        std::to_string(at >> 30) + " GiB, more than iprobe maps (" + std::to_string(kMaxRegion >> 30) +
                        " GiB, sparse): ask for fewer --max-threads or a smaller --buffer",
                    ExitCode::usage);
    cb.region_size = at;
    cb.tsc_hz = tsc.hz;
    cb.tsc_base = tsc.tsc_base;
    cb.realtime_ns_base = tsc.realtime_ns_base;
    cb.clock = tsc.monotonic ? IPROBE_RT_CLOCK_MONOTONIC : IPROBE_RT_CLOCK_TSC;
    return cb;
}

bool runtime_file_name(std::string_view basename) {
    constexpr std::string_view stem = "libiprobe-rt", suffix = ".so";
    return basename.size() >= stem.size() + suffix.size() && basename.starts_with(stem) &&
           basename.find(suffix, stem.size()) != std::string_view::npos;
}

std::optional<MappedRuntime> mapped_runtime(pid_t pid) {
    std::optional<MappedRuntime> found;
    for (const auto& m : read_maps(pid)) {
        const std::string_view path = m.path;
        if (m.offset != 0 || !runtime_file_name(path.substr(path.rfind('/') + 1))) continue;
        const elf::ElfFile elf = reading_target(pid, [&] { return elf::ElfFile(target_view(pid, m.path)); });
        const elf::ElfSymbol* symbol = elf.symbol_named("iprobe_rt_state");
        if (!symbol || !symbol->defined()) continue;
        MappedRuntime runtime{m.path, m.start - elf.first_load_vaddr() + symbol->address, {}};
        runtime.state = ProcessMemory(pid).read_value<struct iprobe_rt_state>(runtime.state_address);
        if (std::memcmp(runtime.state.magic, IPROBE_RT_STATE_MAGIC, 8) != 0) continue;
        if (!found || (found->state.control == 0 && runtime.state.control != 0)) found = std::move(runtime);
    }
    return found;
}

std::optional<std::uint64_t> runtime_state_address(pid_t pid) {
    const auto runtime = mapped_runtime(pid);
    if (!runtime) return std::nullopt;
    return runtime->state_address;
}

std::optional<struct iprobe_rt_state> runtime_state(pid_t pid) {
    const auto runtime = mapped_runtime(pid);
    if (!runtime) return std::nullopt;
    return runtime->state;
}

std::vector<iprobe_rt_module> inherited_modules(pid_t pid, const struct iprobe_rt_state& state) {
    if (state.control != 0 || state.inherited_modules == 0 || state.inherited_module_count == 0) return {};
    std::vector<iprobe_rt_module> modules(std::min(state.inherited_module_count, kMaxInheritedModules));
    try {
        ProcessMemory(pid).read(state.inherited_modules, modules.data(), modules.size() * sizeof(iprobe_rt_module));
    } catch (const Error&) {
        return {};  // unmapped or rewritten by the target: nothing we can trust
    }
    return modules;
}

void forget_inherited_modules(pid_t pid) {
    const auto at = runtime_state_address(pid);
    if (!at) return;
    const std::uint32_t none = 0;
    ProcessMemory(pid).write(*at + offsetof(struct iprobe_rt_state, inherited_module_count), &none, sizeof none);
}

Region Region::create(UniqueFd fd, const iprobe_rt_control& layout) {
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<std::uint64_t>(st.st_size) != layout.region_size)
        throw Error("the runtime's region memfd has the wrong size", ExitCode::failure);
    // Sealed: neither the target nor anyone else can shrink it under a reader.
    if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
        throw_errno("cannot seal the iprobe region");
    Region region = map(std::move(fd), layout.region_size, layout);
    std::memcpy(region.control_, &layout, sizeof layout);
    return region;
}

std::optional<Region> Region::try_open(pid_t pid) {
    const auto state = runtime_state(pid);
    if (!state) return std::nullopt;
    return try_open(pid, *state);
}

std::optional<Region> Region::try_open(pid_t pid, const struct iprobe_rt_state& state) {
    if (state.control == 0 || state.region_fd < 0) return std::nullopt;
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    if (!pidfd) {
        if (errno == ESRCH) return std::nullopt;
        throw_errno("pidfd_open(" + std::to_string(pid) + ")", errno == EPERM ? ExitCode::permission : ExitCode::failure);
    }
    // Duplicates what the target holds: nothing is opened, so whatever the
    // target put at that number (a FIFO, a device) is never opened by us.
    UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), state.region_fd, 0)));
    if (!fd) {
        if (errno == EBADF || errno == ESRCH) return std::nullopt;
        throw_errno("cannot take the iprobe region of process " + std::to_string(pid) + " (pidfd_getfd)",
                    errno == EPERM ? ExitCode::permission : ExitCode::failure);
    }
    return adopt(std::move(fd), "the iprobe region of process " + std::to_string(pid));
}

Region Region::adopt(UniqueFd fd, const std::string& what) {
    struct stat st {};
    const int seals = ::fcntl(fd.get(), F_GET_SEALS);
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK) ||
        static_cast<std::uint64_t>(st.st_size) < sizeof(iprobe_rt_control) ||
        static_cast<std::uint64_t>(st.st_size) > kMaxRegion)
        throw Error(what + " is not a sealed iprobe memfd", ExitCode::bad_input);
    iprobe_rt_control head{};
    if (::pread(fd.get(), &head, sizeof head, 0) != static_cast<ssize_t>(sizeof head) ||
        std::memcmp(head.magic, IPROBE_RT_MAGIC, 8) != 0 || head.version != IPROBE_RT_VERSION)
        throw Error(what + " is not an iprobe region of this version", ExitCode::bad_input);
    if (!sound_layout(head, static_cast<std::uint64_t>(st.st_size)))
        throw Error(what + " has an inconsistent layout (corrupted?)", ExitCode::bad_input);
    return map(std::move(fd), static_cast<std::uint64_t>(st.st_size), head);
}

Region Region::open(pid_t pid) {
    check_target(pid);
    auto region = try_open(pid);
    if (!region)
        throw Error("process " + std::to_string(pid) + " has no iprobe region: attach to it first with 'iprobe attach " +
                        std::to_string(pid) + "'",
                    ExitCode::not_found);
    return std::move(*region);
}

Region Region::map(UniqueFd fd, std::uint64_t size, const iprobe_rt_control& geometry) {
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd.get(), 0);
    if (base == MAP_FAILED) throw_errno("cannot map the iprobe region");
    Region region;
    region.control_ = static_cast<iprobe_rt_control*>(base);
    region.size_ = size;
    region.geometry_ = geometry;
    region.fd_ = std::move(fd);
    return region;
}

Region::Region(Region&& other) noexcept
    : control_(std::exchange(other.control_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      geometry_(other.geometry_),
      fd_(std::move(other.fd_)) {}

Region& Region::operator=(Region&& other) noexcept {
    if (this != &other) {
        if (control_) ::munmap(control_, size_);
        control_ = std::exchange(other.control_, nullptr);
        size_ = std::exchange(other.size_, 0);
        geometry_ = other.geometry_;
        fd_ = std::move(other.fd_);
    }
    return *this;
}

Region::~Region() {
    if (control_) ::munmap(control_, size_);
}

std::uint32_t Region::module_count() const {
    return std::min(__atomic_load_n(&control_->module_count, __ATOMIC_ACQUIRE), geometry_.module_capacity);
}
std::uint32_t Region::probe_count() const {
    return std::min(__atomic_load_n(&control_->probe_count, __ATOMIC_ACQUIRE), geometry_.probe_capacity);
}
std::uint32_t Region::condition_count() const {
    return std::min(__atomic_load_n(&control_->condition_count, __ATOMIC_ACQUIRE), geometry_.condition_capacity);
}
iprobe_cond_program* Region::conditions() const {
    return at<iprobe_cond_program>(control_, geometry_.conditions_offset);
}
std::uint32_t Region::stat_count() const {
    return std::min(__atomic_load_n(&control_->stat_count, __ATOMIC_ACQUIRE), geometry_.stat_capacity);
}

iprobe_rt_module* Region::modules() const { return at<iprobe_rt_module>(control_, geometry_.modules_offset); }
iprobe_rt_probe* Region::probes() const { return at<iprobe_rt_probe>(control_, geometry_.probes_offset); }
iprobe_rt_site* Region::sites() const { return at<iprobe_rt_site>(control_, geometry_.hash_offset); }
iprobe_rt_ring* Region::ring(std::uint32_t index) const {
    return at<iprobe_rt_ring>(control_, geometry_.rings_offset + geometry_.ring_stride * index);
}
iprobe_rt_record* Region::records(std::uint32_t index) const {
    return reinterpret_cast<iprobe_rt_record*>(ring(index) + 1);
}
iprobe_rt_thread* Region::thread(std::uint32_t index) const {
    return at<iprobe_rt_thread>(control_, geometry_.threads_offset + geometry_.thread_stride * index);
}
iprobe_rt_fn_stats* Region::thread_stats(std::uint32_t index) const {
    return at<iprobe_rt_fn_stats>(control_, geometry_.threads_offset + geometry_.thread_stride * index +
                                                geometry_.thread_header_size);
}
iprobe_rt_exit_marks* Region::exit_marks(std::uint32_t slot) const {
    if (!geometry_.exit_marks_offset || slot >= geometry_.thread_count) return nullptr;
    return at<iprobe_rt_exit_marks>(control_, geometry_.exit_marks_offset + sizeof(iprobe_rt_exit_marks) * slot);
}
iprobe_rt_fn_stats* Region::baseline() const { return at<iprobe_rt_fn_stats>(control_, geometry_.baseline_offset); }

bool Region::touched(const void* p, std::size_t size) const {
    const auto base = reinterpret_cast<std::uintptr_t>(control_);
    std::uintptr_t from = reinterpret_cast<std::uintptr_t>(p) & ~(kPage - 1);
    const std::uintptr_t to = std::min<std::uintptr_t>(reinterpret_cast<std::uintptr_t>(p) + size, base + size_);
    if (from < base || from >= to) return false;
    unsigned char vec[256];
    while (from < to) {
        const std::size_t pages = std::min<std::size_t>((to - from + kPage - 1) / kPage, sizeof vec);
        // A memfd page is resident from its first write until the region dies.
        if (::mincore(reinterpret_cast<void*>(from), pages * kPage, vec) != 0) return true;
        for (std::size_t i = 0; i < pages; i++)
            if (vec[i] & 1) return true;
        from += pages * kPage;
    }
    return false;
}

std::vector<unsigned char> Region::touched_pages(const void* p, std::size_t size) const {
    const auto base = reinterpret_cast<std::uintptr_t>(control_);
    const std::uintptr_t from = reinterpret_cast<std::uintptr_t>(p) & ~(kPage - 1);
    const std::uintptr_t to = std::min<std::uintptr_t>(reinterpret_cast<std::uintptr_t>(p) + size, base + size_);
    if (from < base || from >= to) return {};
    std::vector<unsigned char> pages((to - from + kPage - 1) / kPage, 1);
    if (::mincore(reinterpret_cast<void*>(from), pages.size() * kPage, pages.data()) != 0) return pages;
    for (auto& v : pages) v &= 1;
    return pages;
}

void Region::insert_site(std::uint64_t return_address, std::uint32_t probe, std::uint32_t stat) {
    iprobe_rt_site* table = sites();
    const std::uint32_t bits = geometry_.hash_bits;
    const std::uint64_t mask = (1ull << bits) - 1;
    std::uint64_t slot = (return_address * 0x9E3779B97F4A7C15ull) >> (64 - bits);
    for (std::uint64_t probed = 0; probed <= mask; probed++) {
        const std::uint64_t key = table[slot].return_address;
        if (key == return_address) return;
        if (key == 0) {
            if (control_->hash_used + 1 > (mask + 1) / 2 + (mask + 1) / 4)
                throw Error("the iprobe site table is full; restart the process to attach more probes");
            table[slot].probe = probe;
            table[slot].stat = stat;
            __atomic_store_n(&table[slot].return_address, return_address, __ATOMIC_RELEASE);
            control_->hash_used++;
            return;
        }
        slot = (slot + 1) & mask;
    }
    throw Error("the iprobe site table is full; restart the process to attach more probes");
}

namespace {

// O_PATH opens nothing (no driver, no FIFO wait); only a regular file is
// then read, through that very inode (/proc/self/fd/N).
UniqueFd regular_file(const std::string& path) {
    UniqueFd handle(::open(path.c_str(), O_PATH | O_CLOEXEC));
    struct stat st {};
    if (!handle || ::fstat(handle.get(), &st) != 0 || !S_ISREG(st.st_mode)) return {};
    return handle;
}

std::string fd_path(const UniqueFd& fd) { return "/proc/self/fd/" + std::to_string(fd.get()); }

}  // namespace

namespace {

// A list file is read whole; anything larger than this is not taken for one
// (the list of a binary with a million functions is about 200 MB).
constexpr off_t kMaxProbeListBytes = off_t{256} << 20;

std::optional<probelist::ProbeList> list_file(const UniqueFd& file) {
    const UniqueFd readable(::open(fd_path(file).c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    char magic[IPROBE_PL_MAGIC_SIZE];
    if (!readable || ::fstat(readable.get(), &st) != 0 || st.st_size > kMaxProbeListBytes ||
        ::pread(readable.get(), magic, sizeof magic, 0) != static_cast<ssize_t>(sizeof magic) ||
        std::memcmp(magic, IPROBE_PL_MAGIC, sizeof magic) != 0)
        return std::nullopt;
    try {
        return probelist::ProbeList::load(fd_path(readable));
    } catch (const std::exception&) {
        return std::nullopt;
    }
}

}  // namespace

namespace {

std::optional<probelist::ProbeList> list_of_file(const std::string& path, bool or_symbols) {
    const UniqueFd file = regular_file(path);
    if (!file) return std::nullopt;
    if (auto list = list_file(file)) return list;
    if (const UniqueFd side = regular_file(path + IPROBE_PL_SUFFIX))
        if (auto list = list_file(side)) return list;
    try {
        if (auto list = probelist::read_site_section(fd_path(file))) return list;
        if (or_symbols) return probelist::probes_from_symbols(fd_path(file));  // nobody prepared it
    } catch (const std::exception&) {
    }
    return std::nullopt;
}

}  // namespace

std::optional<probelist::ProbeList> prepared_probe_list_at(const std::string& path) {
    return list_of_file(path, false);
}

std::optional<probelist::ProbeList> probe_list_at(const std::string& path) {
    return list_of_file(path, true);
}

std::optional<probelist::ProbeList> module_probe_list(const iprobe_rt_module& module) {
    const std::string path(module.probes_path, ::strnlen(module.probes_path, sizeof module.probes_path));
    if (path.empty() || path[0] != '/') return std::nullopt;
    // The path is the target's word: only a file its owner cannot have
    // planted (root's, or the caller's own) is opened.
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || (st.st_uid != 0 && st.st_uid != ::geteuid())) return std::nullopt;
    auto list = probe_list_at(path);
    if (!list) return std::nullopt;
    const std::size_t id_size = std::min<std::size_t>(module.build_id_size, sizeof module.build_id);
    if (list->build_id.size() != id_size || !std::equal(list->build_id.begin(), list->build_id.end(), module.build_id))
        return std::nullopt;
    return list;
}

}  // namespace iprobe::hotpatch
