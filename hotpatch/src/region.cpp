#include "region.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe::hotpatch {

namespace {

constexpr std::uint64_t kPage = 4096;

std::uint64_t round_up(std::uint64_t v, std::uint64_t to) { return (v + to - 1) / to * to; }

std::uint64_t now_ns(clockid_t clock) {
    timespec ts{};
    ::clock_gettime(clock, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// The TSC is invariant on the machines we support (constant_tsc): one
// calibration against CLOCK_MONOTONIC serves every process.
}  // namespace

TscCalibration calibrate_tsc() {
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

namespace {

}  // namespace

static Region map_fd(int fd, std::size_t size);

std::string Region::path(pid_t pid) { return "/dev/shm" IPROBE_RT_SHM_PREFIX + std::to_string(pid); }

bool Region::exists(pid_t pid) {
    struct stat st {};
    return ::stat(path(pid).c_str(), &st) == 0;
}

void Region::remove(pid_t pid) { ::unlink(path(pid).c_str()); }

Region Region::create(pid_t pid, uid_t uid, gid_t gid, const RegionGeometry& g, const TscCalibration& tsc) {
    if (g.ring_records == 0 || (g.ring_records & (g.ring_records - 1)) != 0)
        throw Error("ring size must be a power of two (records per thread)", ExitCode::usage);
    std::uint32_t hash_bits = 4;
    while ((1ull << hash_bits) < 2ull * g.probe_capacity) hash_bits++;

    iprobe_rt_control cb{};
    std::memcpy(cb.magic, IPROBE_RT_MAGIC, 8);
    cb.version = IPROBE_RT_VERSION;
    cb.header_size = sizeof cb;
    cb.owner_pid = static_cast<std::uint32_t>(pid);
    std::uint64_t at = round_up(sizeof cb, kPage);
    cb.modules_offset = at;
    cb.module_capacity = g.module_capacity;
    at = round_up(at + sizeof(iprobe_rt_module) * g.module_capacity, kPage);
    cb.probes_offset = at;
    cb.probe_capacity = g.probe_capacity;
    at = round_up(at + sizeof(iprobe_rt_probe) * g.probe_capacity, kPage);
    cb.counts_offset = at;
    at = round_up(at + sizeof(std::uint64_t) * g.probe_capacity, kPage);
    cb.hash_offset = at;
    cb.hash_bits = hash_bits;
    at = round_up(at + sizeof(iprobe_rt_site) * (1ull << hash_bits), kPage);
    cb.rings_offset = at;
    cb.ring_count = g.ring_count;
    cb.ring_records = g.ring_records;
    cb.ring_stride = round_up(sizeof(iprobe_rt_ring) + sizeof(iprobe_rt_record) * g.ring_records, kPage);
    at += cb.ring_stride * g.ring_count;
    cb.region_size = at;
    cb.tsc_hz = tsc.hz;
    cb.tsc_base = tsc.tsc_base;
    cb.realtime_ns_base = tsc.realtime_ns_base;

    const std::string file = path(pid);
    ::unlink(file.c_str());
    UniqueFd fd(::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd) throw_errno("cannot create " + file);
    if (::fchown(fd.get(), uid, gid) != 0 && errno != EPERM) throw_errno("chown " + file);
    if (::ftruncate(fd.get(), static_cast<off_t>(cb.region_size)) != 0) {
        ::unlink(file.c_str());
        throw_errno("cannot size " + file);
    }
    // Metadata pages are reserved now; ring pages when a thread claims one.
    if (::posix_fallocate(fd.get(), 0, static_cast<off_t>(cb.rings_offset)) != 0) {
        ::unlink(file.c_str());
        throw Error("not enough room in /dev/shm for the iprobe control block of " + std::to_string(pid),
                    ExitCode::unavailable);
    }
    Region region = map_fd(fd.get(), cb.region_size);
    std::memcpy(region.control_, &cb, sizeof cb);
    return region;
}

Region Region::open(pid_t pid) {
    const std::string file = path(pid);
    UniqueFd fd(::open(file.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC));
    if (!fd) {
        if (errno == ENOENT)
            throw Error("process " + std::to_string(pid) + " has no iprobe region (" + file +
                            "): attach to it first with 'iprobe attach " + std::to_string(pid) + "'",
                        ExitCode::not_found);
        throw_errno("cannot open " + file, errno == EACCES ? ExitCode::permission : ExitCode::failure);
    }
    struct stat st {};
    ::fstat(fd.get(), &st);
    if (static_cast<std::size_t>(st.st_size) < sizeof(iprobe_rt_control))
        throw Error(file + " is not an iprobe region", ExitCode::bad_input);
    Region region = map_fd(fd.get(), static_cast<std::size_t>(st.st_size));
    const auto* cb = region.control();
    if (std::memcmp(cb->magic, IPROBE_RT_MAGIC, 8) != 0 || cb->version != IPROBE_RT_VERSION ||
        cb->region_size != static_cast<std::uint64_t>(st.st_size))
        throw Error(file + " is not an iprobe region of this version", ExitCode::bad_input);
    // The target can write its region: never trust the layout blindly.
    const std::uint64_t size = cb->region_size;
    auto fits = [size](std::uint64_t offset, std::uint64_t count, std::uint64_t each) {
        return offset <= size && count <= (size - offset) / (each ? each : 1);
    };
    const bool sane = cb->hash_bits >= 4 && cb->hash_bits < 40 && cb->ring_records != 0 &&
                      (cb->ring_records & (cb->ring_records - 1)) == 0 &&
                      cb->ring_stride >= sizeof(iprobe_rt_ring) + sizeof(iprobe_rt_record) * cb->ring_records &&
                      cb->module_count <= cb->module_capacity && cb->probe_count <= cb->probe_capacity &&
                      fits(cb->modules_offset, cb->module_capacity, sizeof(iprobe_rt_module)) &&
                      fits(cb->probes_offset, cb->probe_capacity, sizeof(iprobe_rt_probe)) &&
                      fits(cb->counts_offset, cb->probe_capacity, sizeof(std::uint64_t)) &&
                      fits(cb->hash_offset, 1ull << cb->hash_bits, sizeof(iprobe_rt_site)) &&
                      fits(cb->rings_offset, cb->ring_count, cb->ring_stride);
    if (!sane) throw Error(file + " has an inconsistent layout (corrupted?)", ExitCode::bad_input);
    for (std::uint32_t i = 0; i < cb->module_count; i++) {
        const auto& m = region.modules()[i];
        if (m.first_probe > cb->probe_capacity || m.probe_count > cb->probe_capacity - m.first_probe)
            throw Error(file + " has an inconsistent module table (corrupted?)", ExitCode::bad_input);
    }
    return region;
}

static Region map_fd(int fd, std::size_t size) {
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) throw_errno("cannot map the iprobe region");
    return Region::adopt(static_cast<iprobe_rt_control*>(base), size);
}

Region Region::adopt(iprobe_rt_control* base, std::size_t size) {
    Region region;
    region.control_ = base;
    region.size_ = size;
    return region;
}

Region::Region(Region&& other) noexcept
    : control_(std::exchange(other.control_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Region& Region::operator=(Region&& other) noexcept {
    if (this != &other) {
        if (control_) ::munmap(control_, size_);
        control_ = std::exchange(other.control_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

Region::~Region() {
    if (control_) ::munmap(control_, size_);
}

namespace {
template <typename T>
T* at(iprobe_rt_control* cb, std::uint64_t offset) {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(cb) + offset);
}
}  // namespace

iprobe_rt_module* Region::modules() const { return at<iprobe_rt_module>(control_, control_->modules_offset); }
iprobe_rt_probe* Region::probes() const { return at<iprobe_rt_probe>(control_, control_->probes_offset); }
std::uint64_t* Region::counts() const { return at<std::uint64_t>(control_, control_->counts_offset); }
iprobe_rt_site* Region::sites() const { return at<iprobe_rt_site>(control_, control_->hash_offset); }
iprobe_rt_ring* Region::ring(std::uint32_t index) const {
    return at<iprobe_rt_ring>(control_, control_->rings_offset + control_->ring_stride * index);
}
iprobe_rt_record* Region::records(std::uint32_t index) const {
    return reinterpret_cast<iprobe_rt_record*>(ring(index) + 1);
}

void Region::insert_site(std::uint64_t return_address, std::uint32_t probe) {
    iprobe_rt_site* table = sites();
    const std::uint32_t bits = control_->hash_bits;
    const std::uint64_t mask = (1ull << bits) - 1;
    std::uint64_t slot = (return_address * 0x9E3779B97F4A7C15ull) >> (64 - bits);
    for (;;) {
        const std::uint64_t key = table[slot].return_address;
        if (key == return_address) return;
        if (key == 0) {
            if (control_->hash_used + 1 > (mask + 1) / 2 + (mask + 1) / 4)
                throw Error("the iprobe site table is full; restart the process to attach more probes");
            table[slot].probe = probe;
            __atomic_store_n(&table[slot].return_address, return_address, __ATOMIC_RELEASE);
            control_->hash_used++;
            return;
        }
        slot = (slot + 1) & mask;
    }
}

}  // namespace iprobe::hotpatch
