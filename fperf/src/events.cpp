#include "iprobe/fperf/events.h"

#include <papi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "iprobe/fperf/kernel_counter.h"

namespace iprobe::fperf {

namespace {

// ---- PAPI ----

bool papi_ready() {
    static const bool ready = papi_allowed() && PAPI_library_init(PAPI_VER_CURRENT) == PAPI_VER_CURRENT;
    return ready;
}

// PAPI_OK when `names` can be counted together in one event set.
int papi_try_count(const std::vector<std::string>& names) {
    int set = PAPI_NULL;
    int rc = PAPI_create_eventset(&set);
    if (rc != PAPI_OK) return rc;
    for (const auto& n : names) {
        int code = 0;
        rc = PAPI_event_name_to_code(n.c_str(), &code);
        if (rc == PAPI_OK) rc = PAPI_add_event(set, code);
        if (rc != PAPI_OK) break;
    }
    if (rc == PAPI_OK) {
        rc = PAPI_start(set);
        long long values[FPERF_MAX_EVENTS + 1];
        if (rc == PAPI_OK) PAPI_stop(set, values);
    }
    PAPI_cleanup_eventset(set);
    PAPI_destroy_eventset(&set);
    return rc;
}

bool papi_knows(const std::string& name) {
    int code = 0;
    return papi_ready() && PAPI_event_name_to_code(name.c_str(), &code) == PAPI_OK;
}

std::string papi_reason(int rc) {
    if (rc == PAPI_ENOEVNT || rc == PAPI_ECNFLCT || rc == PAPI_EINVAL || rc == PAPI_ESYS)
        return std::string("cannot be counted on this machine (") + PAPI_strerror(rc) +
               "; no hardware PMU, or counters exhausted)";
    return PAPI_strerror(rc);
}

// ---- the kernel ----

struct KernelName {
    const char* name;  // canonical, as `fperf events` lists it
    std::uint32_t type;
    std::uint64_t config;
    std::vector<const char*> aliases;  // upper case; the PAPI presets it stands for
};

constexpr std::uint64_t cache_event(std::uint64_t cache, std::uint64_t op, std::uint64_t result) {
    return cache | (op << 8) | (result << 16);
}

const std::vector<KernelName>& kernel_names() {
    static const std::vector<KernelName> names = {
        {"perf::PAGE-FAULTS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS, {"FAULTS", "PERF_COUNT_SW_PAGE_FAULTS"}},
        {"perf::MINOR-FAULTS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS_MIN, {"PERF_COUNT_SW_PAGE_FAULTS_MIN"}},
        {"perf::MAJOR-FAULTS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_PAGE_FAULTS_MAJ, {"PERF_COUNT_SW_PAGE_FAULTS_MAJ"}},
        {"perf::CONTEXT-SWITCHES", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES, {"CS", "PERF_COUNT_SW_CONTEXT_SWITCHES"}},
        {"perf::CPU-MIGRATIONS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS, {"MIGRATIONS", "PERF_COUNT_SW_CPU_MIGRATIONS"}},
        {"perf::TASK-CLOCK", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK, {"PERF_COUNT_SW_TASK_CLOCK"}},
        {"perf::CPU-CLOCK", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, {"PERF_COUNT_SW_CPU_CLOCK"}},
        {"perf::ALIGNMENT-FAULTS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_ALIGNMENT_FAULTS, {"PERF_COUNT_SW_ALIGNMENT_FAULTS"}},
        {"perf::EMULATION-FAULTS", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_EMULATION_FAULTS, {"PERF_COUNT_SW_EMULATION_FAULTS"}},
        {"perf::CGROUP-SWITCHES", PERF_TYPE_SOFTWARE, 11 /* PERF_COUNT_SW_CGROUP_SWITCHES, Linux 5.13 */,
         {"PERF_COUNT_SW_CGROUP_SWITCHES"}},
        {"perf::CYCLES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, {"CPU-CYCLES", "PAPI_TOT_CYC"}},
        {"perf::INSTRUCTIONS", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, {"PAPI_TOT_INS"}},
        {"perf::REF-CYCLES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_REF_CPU_CYCLES, {"PAPI_REF_CYC"}},
        {"perf::BRANCHES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_INSTRUCTIONS,
         {"BRANCH-INSTRUCTIONS", "PAPI_BR_INS"}},
        {"perf::BRANCH-MISSES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_BRANCH_MISSES, {"PAPI_BR_MSP"}},
        {"perf::CACHE-REFERENCES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES, {}},
        {"perf::CACHE-MISSES", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES, {}},
        {"perf::STALLED-CYCLES-FRONTEND", PERF_TYPE_HARDWARE, PERF_COUNT_HW_STALLED_CYCLES_FRONTEND, {}},
        {"perf::STALLED-CYCLES-BACKEND", PERF_TYPE_HARDWARE, PERF_COUNT_HW_STALLED_CYCLES_BACKEND, {}},
        {"perf::L1-DCACHE-LOAD-MISSES", PERF_TYPE_HW_CACHE,
         cache_event(PERF_COUNT_HW_CACHE_L1D, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
         {"PAPI_L1_DCM"}},
        {"perf::L1-ICACHE-LOAD-MISSES", PERF_TYPE_HW_CACHE,
         cache_event(PERF_COUNT_HW_CACHE_L1I, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
         {"PAPI_L1_ICM"}},
        {"perf::LLC-LOAD-MISSES", PERF_TYPE_HW_CACHE,
         cache_event(PERF_COUNT_HW_CACHE_LL, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS), {}},
        {"perf::DTLB-LOAD-MISSES", PERF_TYPE_HW_CACHE,
         cache_event(PERF_COUNT_HW_CACHE_DTLB, PERF_COUNT_HW_CACHE_OP_READ, PERF_COUNT_HW_CACHE_RESULT_MISS),
         {"PAPI_TLB_DM"}},
    };
    return names;
}

std::string upper(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
}

// A raw PMU code: r followed by 1 to 16 hex digits, as perf writes it.
std::optional<std::uint64_t> raw_code(std::string_view s) {
    if (s.size() < 2 || s.size() > 17 || (s[0] != 'r' && s[0] != 'R')) return std::nullopt;
    std::uint64_t code = 0;
    for (char c : s.substr(1)) {
        if (!std::isxdigit(static_cast<unsigned char>(c))) return std::nullopt;
        code = code << 4 | static_cast<std::uint64_t>(std::isdigit(static_cast<unsigned char>(c))
                                                          ? c - '0'
                                                          : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10);
    }
    return code;
}

// 0 when `events` can be opened together on this thread, else the errno.
int kernel_try_count(const std::vector<fperf_event_source>& events) {
    std::vector<int> fds;
    int err = 0;
    for (const auto& e : events) {
        const int fd = fperf_open_kernel_counter(&e, fds.empty() ? -1 : fds.front());
        if (fd < 0) {
            err = -fd;
            break;
        }
        fds.push_back(fd);
    }
    if (!err && !fds.empty()) {
        std::uint64_t values[FPERF_MAX_EVENTS];
        if (fperf_read_kernel_group(fds.front(), values, static_cast<std::uint32_t>(fds.size())) != 0) err = EIO;
    }
    for (auto it = fds.rbegin(); it != fds.rend(); ++it) ::close(*it);
    return err;
}

std::string kernel_reason(const fperf_event_source& e, int err) {
    std::string why = std::string("perf_event_open: ") + std::strerror(err);
    if (err == EACCES || err == EPERM)
        return "not permitted to count it (" + why +
               "); run as root or lower /proc/sys/kernel/perf_event_paranoid";
    if (e.perf_type != PERF_TYPE_SOFTWARE && (err == ENOENT || err == EOPNOTSUPP || err == ENODEV || err == EINVAL))
        return "cannot be counted on this machine: the kernel has no hardware PMU for it (" + why + ")";
    return "the kernel cannot count it here (" + why + ")";
}

std::vector<fperf_event_source> kernel_sources_of(const std::vector<MeasuredEvent>& events) {
    std::vector<fperf_event_source> out;
    for (const auto& m : events)
        if (m.source.backend == FPERF_BACKEND_KERNEL) out.push_back(m.source);
    return out;
}

std::vector<std::string> papi_names_of(const std::vector<MeasuredEvent>& events) {
    std::vector<std::string> out;
    for (const auto& m : events)
        if (m.source.backend == FPERF_BACKEND_PAPI) out.push_back(m.name);
    return out;
}

// Why `name` is not measured, given what each backend said (rc: PAPI's, err: the kernel's).
std::string reason_for(const std::string& name, const std::optional<fperf_event_source>& kernel, int papi_rc,
                       int kernel_err, bool together) {
    if (together) return "cannot be counted together with the events before it (counters exhausted)";
    if (kernel) return kernel_reason(*kernel, kernel_err);
    if (!papi_allowed())
        return "no event by this name: the kernel does not know it, and PAPI is turned off (FPERF_PAPI=off)";
    if (!papi_ready()) return "no event by this name: the kernel does not know it, and PAPI could not be initialised";
    if (!papi_knows(name))
        return "no event by this name: neither PAPI nor the kernel knows it (`fperf events` lists what this "
               "machine counts)";
    return papi_reason(papi_rc);
}

}  // namespace

const char* backend_name(std::uint32_t backend) { return backend == FPERF_BACKEND_KERNEL ? "perf_event" : "papi"; }

bool papi_allowed() {
    static const bool allowed = [] {
        const char* v = std::getenv("FPERF_PAPI");
        return !(v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0));
    }();
    return allowed;
}

const std::vector<std::string>& default_events() {
    static const std::vector<std::string> events = {
        "PAPI_TOT_CYC", "PAPI_TOT_INS", "PAPI_L1_DCM", "perf::PAGE-FAULTS", "perf::CONTEXT-SWITCHES"};
    return events;
}

std::optional<fperf_event_source> kernel_event(const std::string& name) {
    std::string_view bare = name;
    if (bare.starts_with("perf::")) bare.remove_prefix(6);
    if (const auto code = raw_code(bare)) return fperf_event_source{FPERF_BACKEND_KERNEL, PERF_TYPE_RAW, *code};
    const std::string key = upper(bare);
    for (const auto& k : kernel_names()) {
        bool match = key == std::string_view(k.name).substr(6);
        for (const char* alias : k.aliases) match |= key == alias;
        if (match) return fperf_event_source{FPERF_BACKEND_KERNEL, k.type, k.config};
    }
    return std::nullopt;
}

EventChoice resolve_events(const std::vector<std::string>& requested) {
    EventChoice choice;
    for (const auto& name : requested) {
        bool duplicate = false;
        for (const auto& m : choice.measured) duplicate |= m.name == name;
        for (const auto& u : choice.unavailable) duplicate |= u.name == name;
        if (duplicate) continue;
        if (choice.measured.size() >= FPERF_MAX_EVENTS) {
            choice.unavailable.push_back({name, "more than " + std::to_string(FPERF_MAX_EVENTS) + " events asked for"});
            continue;
        }
        const auto kernel = kernel_event(name);
        int papi_rc = PAPI_ENOEVNT, kernel_err = 0;
        bool together_failed = false;
        // The kernel's own events go to the kernel backend even where PAPI
        // has them: PAPI counts in the user domain, where a context switch
        // never happens, so it reads 0 for them.
        const bool software = kernel && kernel->perf_type == PERF_TYPE_SOFTWARE;
        auto try_papi = [&] {
            if (!papi_knows(name)) return false;
            papi_rc = papi_try_count({name});
            if (papi_rc != PAPI_OK) return false;
            auto with = papi_names_of(choice.measured);
            with.push_back(name);
            if (papi_try_count(with) == PAPI_OK) return true;
            together_failed = true;
            return false;
        };
        auto try_kernel = [&] {
            if (!kernel) return false;
            kernel_err = kernel_try_count({*kernel});
            if (kernel_err != 0) return false;
            auto with = kernel_sources_of(choice.measured);
            with.push_back(*kernel);
            if (kernel_try_count(with) == 0) return true;
            together_failed = true;
            return false;
        };
        if (!software && try_papi()) {
            choice.measured.push_back({name, {FPERF_BACKEND_PAPI, 0, 0}});
            continue;
        }
        if (try_kernel()) {
            choice.measured.push_back({name, *kernel});
            continue;
        }
        if (software && try_papi()) {
            choice.measured.push_back({name, {FPERF_BACKEND_PAPI, 0, 0}});
            continue;
        }
        choice.unavailable.push_back({name, reason_for(name, kernel, papi_rc, kernel_err, together_failed)});
    }
    return choice;
}

std::vector<MeasuredEvent> available_events() {
    std::vector<MeasuredEvent> out;
    auto listed = [&](const std::string& n) {
        return std::any_of(out.begin(), out.end(), [&](const MeasuredEvent& m) { return m.name == n; });
    };
    if (papi_ready()) {
        int code = PAPI_PRESET_MASK;
        if (PAPI_enum_event(&code, PAPI_ENUM_FIRST) == PAPI_OK) {
            do {
                PAPI_event_info_t info;
                if (PAPI_get_event_info(code, &info) == PAPI_OK && info.count > 0 &&
                    papi_try_count({info.symbol}) == PAPI_OK)
                    out.push_back({info.symbol, {FPERF_BACKEND_PAPI, 0, 0}});
            } while (PAPI_enum_event(&code, PAPI_PRESET_ENUM_AVAIL) == PAPI_OK);
        }
        for (int cid = 0; cid < PAPI_num_components(); cid++) {
            code = PAPI_NATIVE_MASK;
            if (PAPI_enum_cmp_event(&code, PAPI_ENUM_FIRST, cid) != PAPI_OK) continue;
            do {
                char name[PAPI_MAX_STR_LEN];
                if (PAPI_event_code_to_name(code, name) != PAPI_OK) continue;
                const auto kernel = kernel_event(name);
                if (kernel && kernel->perf_type == PERF_TYPE_SOFTWARE) continue;  // the kernel's, listed below
                if (papi_try_count({name}) == PAPI_OK) out.push_back({name, {FPERF_BACKEND_PAPI, 0, 0}});
            } while (PAPI_enum_cmp_event(&code, PAPI_ENUM_EVENTS, cid) == PAPI_OK);
        }
    }
    for (const auto& k : kernel_names()) {
        const fperf_event_source source{FPERF_BACKEND_KERNEL, k.type, k.config};
        if (!listed(k.name) && kernel_try_count({source}) == 0) out.push_back({k.name, source});
    }
    return out;
}

// ---- EventReader ----

EventReader::EventReader(const std::vector<MeasuredEvent>& events) : papi_set_(PAPI_NULL) {
    const auto papi = papi_names_of(events);
    if (!papi.empty() && papi_ready() && PAPI_create_eventset(&papi_set_) == PAPI_OK) {
        for (const auto& n : papi) {
            int code = 0;
            if (PAPI_event_name_to_code(n.c_str(), &code) == PAPI_OK) PAPI_add_event(papi_set_, code);
        }
        if (PAPI_num_events(papi_set_) <= 0 || PAPI_start(papi_set_) != PAPI_OK) {
            PAPI_cleanup_eventset(papi_set_);
            PAPI_destroy_eventset(&papi_set_);
            papi_set_ = PAPI_NULL;
        }
    }
    for (const auto& source : kernel_sources_of(events)) {
        const int fd = fperf_open_kernel_counter(&source, kernel_group_);
        if (fd < 0) continue;
        if (kernel_group_ < 0) kernel_group_ = fd;
        kernel_fds_.push_back(fd);
    }
}

EventReader::~EventReader() {
    if (papi_set_ != PAPI_NULL) {
        long long values[FPERF_MAX_EVENTS + 1];
        PAPI_stop(papi_set_, values);
        PAPI_cleanup_eventset(papi_set_);
        PAPI_destroy_eventset(&papi_set_);
    }
    for (auto it = kernel_fds_.rbegin(); it != kernel_fds_.rend(); ++it) ::close(*it);
}

void EventReader::read() {
    if (papi_set_ != PAPI_NULL) {
        long long values[FPERF_MAX_EVENTS + 1];
        PAPI_read(papi_set_, values);
    }
    if (kernel_group_ >= 0) {
        std::uint64_t values[FPERF_MAX_EVENTS];
        fperf_read_kernel_group(kernel_group_, values, static_cast<std::uint32_t>(kernel_fds_.size()));
    }
}

} // namespace iprobe::fperf
