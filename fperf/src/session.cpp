#include "iprobe/fperf/session.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <filesystem>
#include <cstring>
#include <utility>

#include "iprobe/support/error.h"
#include "iprobe/support/fd.h"

namespace iprobe::fperf {

using iprobe::Error;
using iprobe::ExitCode;

std::string shm_path(pid_t pid) { return "/dev/shm" FPERF_SHM_PREFIX + std::to_string(pid); }

std::uint64_t monotonic_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

namespace {

void close_previous(const std::string& path) {
    iprobe::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) return;
    struct stat sb{};
    if (::fstat(fd.get(), &sb) == 0 && static_cast<std::size_t>(sb.st_size) >= sizeof(fperf_shm_header)) {
        void* p = ::mmap(nullptr, sizeof(fperf_shm_header), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
        if (p != MAP_FAILED) {
            auto* h = static_cast<fperf_shm_header*>(p);
            if (h->magic == FPERF_SHM_MAGIC) h->state.store(FPERF_STATE_CLOSED);
            ::munmap(p, sizeof(fperf_shm_header));
        }
    }
    ::unlink(path.c_str());
}

// Regions of processes that are gone, left by a daemon that was killed.
void remove_orphans() {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
        const std::string name = entry.path().filename().string();
        if (!name.starts_with("fperf.")) continue;
        const std::string digits = name.substr(6);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) continue;
        const pid_t owner = static_cast<pid_t>(std::stol(digits));
        if (::kill(owner, 0) != 0 && errno == ESRCH) ::unlink(entry.path().c_str());
    }
}

}  // namespace

SharedSession SharedSession::create(pid_t pid, const SessionConfig& config) {
    if (config.events.size() > FPERF_MAX_EVENTS)
        throw Error("at most " + std::to_string(FPERF_MAX_EVENTS) + " events per recording", ExitCode::usage);
    SharedSession s;
    s.path_ = shm_path(pid);
    remove_orphans();
    close_previous(s.path_);

    const std::uint32_t slots = std::bit_ceil(std::max<std::uint32_t>(config.slot_count, 2));
    const std::size_t header_size =
        (sizeof(fperf_shm_header) + FPERF_HEADER_ALIGN - 1) / FPERF_HEADER_ALIGN * FPERF_HEADER_ALIGN;
    s.size_ = header_size + std::size_t{slots} * sizeof(fperf_function_slot);

    iprobe::UniqueFd fd(::open(s.path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) iprobe::throw_errno("cannot create " + s.path_);
    // The handler only maps a region owned by the user it runs as.
    struct stat target{};
    if (::stat(("/proc/" + std::to_string(pid)).c_str(), &target) == 0 && target.st_uid != ::geteuid())
        if (::fchown(fd.get(), target.st_uid, target.st_gid) != 0) {
            ::unlink(s.path_.c_str());
            iprobe::throw_errno("cannot give " + s.path_ + " to the target's user", ExitCode::permission);
        }
    if (::ftruncate(fd.get(), static_cast<off_t>(s.size_)) != 0) {
        ::unlink(s.path_.c_str());
        iprobe::throw_errno("cannot size " + s.path_);
    }
    void* p = ::mmap(nullptr, s.size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) {
        ::unlink(s.path_.c_str());
        iprobe::throw_errno("cannot map " + s.path_);
    }
    s.header_ = static_cast<fperf_shm_header*>(p);
    auto& h = *s.header_;
    h.version = FPERF_SHM_VERSION;
    h.header_size = static_cast<std::uint32_t>(header_size);
    h.total_size = s.size_;
    h.slot_count = slots;
    h.slot_shift = 64 - static_cast<std::uint32_t>(std::countr_zero(slots));
    h.table_mode = config.table_mode;
    h.target_pid = static_cast<std::uint32_t>(pid);
    h.event_count = static_cast<std::uint32_t>(config.events.size());
    for (std::size_t i = 0; i < config.events.size(); i++) {
        std::snprintf(h.event_names[i], FPERF_EVENT_NAME_MAX, "%s", config.events[i].name.c_str());
        h.event_sources[i] = config.events[i].source;
    }
    h.heartbeat_timeout_ns = config.heartbeat_timeout_ns;
    h.heartbeat_ns.store(monotonic_ns());
    auto* slot = s.slots();
    for (std::uint32_t i = 0; i < slots; i++) slot[i].quota.store(config.initial_quota, std::memory_order_relaxed);
    h.state.store(FPERF_STATE_SETUP);
    // Magic last: a handler that maps the file early sees a complete header or none.
    std::atomic_thread_fence(std::memory_order_release);
    h.magic = FPERF_SHM_MAGIC;
    return s;
}

SharedSession::SharedSession(SharedSession&& other) noexcept { *this = std::move(other); }

SharedSession& SharedSession::operator=(SharedSession&& other) noexcept {
    if (this != &other) {
        this->~SharedSession();
        header_ = std::exchange(other.header_, nullptr);
        size_ = std::exchange(other.size_, 0);
        path_ = std::move(other.path_);
        closed_ = std::exchange(other.closed_, true);
    }
    return *this;
}

SharedSession::~SharedSession() {
    if (!header_) return;
    if (!closed_) close();
    ::munmap(header_, size_);
    header_ = nullptr;
}

fperf_function_slot* SharedSession::slots() const {
    return reinterpret_cast<fperf_function_slot*>(reinterpret_cast<char*>(header_) + header_->header_size);
}

bool SharedSession::register_function(std::uint64_t address) {
    auto* s = slots();
    const std::uint32_t mask = header_->slot_count - 1;
    std::uint32_t i = fperf_home_slot(address, header_->slot_shift);
    for (std::uint32_t n = 0; n < header_->slot_count; n++, i = (i + 1) & mask) {
        std::uint64_t expected = 0;
        if (s[i].address.compare_exchange_strong(expected, address) || expected == address) return true;
    }
    return false;
}

void SharedSession::heartbeat() { header_->heartbeat_ns.store(monotonic_ns(), std::memory_order_release); }

void SharedSession::set_state(fperf_session_state state) { header_->state.store(state); }

bool SharedSession::handler_ready() const { return header_->handler_ready.load() != 0; }

std::vector<SlotSnapshot> SharedSession::snapshot() const {
    std::vector<SlotSnapshot> out;
    auto* s = slots();
    for (std::uint32_t i = 0; i < header_->slot_count; i++) {
        const std::uint64_t address = s[i].address.load(std::memory_order_acquire);
        if (address == 0) continue;
        SlotSnapshot snap;
        snap.slot = i;
        snap.address = address;
        // samples before the sums it counts: a sample in flight may add its
        // deltas after we read them, never the other way round.
        snap.samples = s[i].samples.load(std::memory_order_acquire);
        snap.calls = s[i].calls.load(std::memory_order_relaxed);
        snap.wall_ns = s[i].wall_ns.load(std::memory_order_relaxed);
        snap.cpu_ns = s[i].cpu_ns.load(std::memory_order_relaxed);
        for (int e = 0; e < FPERF_MAX_EVENTS; e++) snap.events[e] = s[i].events[e].load(std::memory_order_relaxed);
        out.push_back(snap);
    }
    return out;
}

void SharedSession::set_quota(std::uint32_t slot, std::int64_t quota) {
    slots()[slot].quota.store(quota, std::memory_order_relaxed);
}

void SharedSession::freeze() {
    auto* s = slots();
    for (std::uint32_t i = 0; i < header_->slot_count; i++) s[i].quota.store(0, std::memory_order_relaxed);
}

void SharedSession::close() {
    if (!header_ || closed_) return;
    freeze();
    set_state(FPERF_STATE_CLOSED);
    ::unlink(path_.c_str());
    closed_ = true;
}

} // namespace iprobe::fperf
