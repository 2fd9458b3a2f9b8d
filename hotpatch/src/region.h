// The attacher's and readers' view of a process's iprobe region (layout:
// iprobe/formats/rt_layout.h): a memfd the runtime creates inside the target, reached
// from outside with pidfd_getfd, so nothing of it outlives the process.
//
// The target can write every byte of its region.  A Region therefore checks
// the layout once, keeps its own copy of every offset, capacity and stride,
// and clamps every live count to that copy: no value read from the region
// can make a reader touch memory outside the mapping, and the mapping is
// sealed against shrinking, so it can never fault.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "iprobe/probelist/probe_list.h"
#include "iprobe/runtime/rt.h"
#include "iprobe/support/fd.h"

namespace iprobe::hotpatch {

struct RegionGeometry {
    std::uint32_t probe_capacity = 0;
    std::uint32_t module_capacity = 64;
    std::uint32_t thread_count = 512;
    std::uint32_t ring_records = 1u << 14;
};

struct TscCalibration {
    std::uint64_t hz = 0, tsc_base = 0, realtime_ns_base = 0;
    bool monotonic = false;  // no invariant TSC (or IPROBE_CLOCK=monotonic): CLOCK_MONOTONIC ns
};
// Measures the TSC rate (20 ms) where the TSC is invariant (constant_tsc and
// nonstop_tsc), else picks CLOCK_MONOTONIC: do it before stopping the target.
TscCalibration calibrate_tsc();

// The control block a region of this geometry starts with (sizes and offsets).
iprobe_rt_control region_layout(const RegionGeometry& geometry, const TscCalibration& tsc);

// The installed runtime's file name.
inline constexpr const char* kRuntimeName = "libiprobe-rt.so";
// Whether a mapped file may be the runtime: libiprobe-rt.so, its hooks build
// (libiprobe-rt-hooks.so) or any copy given to `attach --runtime`, which must
// be named libiprobe-rt*.so so that report, trace and status find it.
bool runtime_file_name(std::string_view basename);

// The runtime mapped in a process: a file runtime_file_name() accepts,
// mapped from its start, defining iprobe_rt_state with its magic; of
// several (a program linked with the hooks build, then attached with the
// installed one), the one holding the region.
struct MappedRuntime {
    std::string path;                // as mapped
    std::uint64_t state_address = 0; // of iprobe_rt_state, in the process
    struct iprobe_rt_state state {};
};
std::optional<MappedRuntime> mapped_runtime(pid_t pid);
// The runtime's state in a process (read through /proc/PID/mem), or nullopt
// when the runtime is not loaded.
std::optional<struct iprobe_rt_state> runtime_state(pid_t pid);
// Where that state is in the process, or nullopt.
std::optional<std::uint64_t> runtime_state_address(pid_t pid);

// A child forked from a probed process: the parent's module table the
// runtime copied at the fork (iprobe_rt_state::inherited_modules), at most
// kMaxInheritedModules; none elsewhere.  Read, never trusted: each module
// is matched to what is mapped and to its list as a region's are.
inline constexpr std::uint32_t kMaxInheritedModules = 4096;
std::vector<iprobe_rt_module> inherited_modules(pid_t pid, const struct iprobe_rt_state& state);
// Says the process's inherited sites are gone (after they were restored).
void forget_inherited_modules(pid_t pid);

class Region {
public:
    // Takes `fd` (this process's copy of the memfd the runtime created),
    // seals its size, maps it and writes `layout` into it.
    static Region create(UniqueFd fd, const iprobe_rt_control& layout);
    // The region of a running process: throws Error(not_found) when it has
    // none, Error(bad_input) when what it offers is not a sound region.
    static Region open(pid_t pid);
    static std::optional<Region> try_open(pid_t pid);
    // The same from a runtime state already read (that of the runtime an
    // attach is using): nullopt when it holds no region.
    static std::optional<Region> try_open(pid_t pid, const struct iprobe_rt_state& state);
    // Checks and maps a region held by `fd` (`what` names it in errors):
    // Error(bad_input) unless it is a sealed memfd holding a sound layout.
    static Region adopt(UniqueFd fd, const std::string& what);

    Region() = default;
    Region(Region&& other) noexcept;
    Region& operator=(Region&& other) noexcept;
    ~Region();

    iprobe_rt_control* control() const { return control_; }
    std::uint64_t size() const { return size_; }

    // Live counts, clamped to the capacities checked at open.
    std::uint32_t module_count() const;
    std::uint32_t probe_count() const;
    std::uint32_t stat_count() const;
    std::uint32_t stat_capacity() const { return geometry_.stat_capacity; }
    std::uint32_t condition_capacity() const { return geometry_.condition_capacity; }
    std::uint32_t condition_count() const;
    iprobe_cond_program* conditions() const;
    std::uint32_t thread_count() const { return geometry_.thread_count; }
    std::uint32_t ring_count() const { return geometry_.ring_count; }
    std::uint32_t ring_records() const { return geometry_.ring_records; }
    std::uint32_t probe_capacity() const { return geometry_.probe_capacity; }

    iprobe_rt_module* modules() const;
    iprobe_rt_probe* probes() const;
    iprobe_rt_site* sites() const;
    iprobe_rt_ring* ring(std::uint32_t index) const;
    iprobe_rt_record* records(std::uint32_t index) const;
    iprobe_rt_thread* thread(std::uint32_t index) const;
    iprobe_rt_fn_stats* thread_stats(std::uint32_t index) const;
    iprobe_rt_fn_stats* baseline() const;
    // Thread slot `slot`'s exit marks (rt_layout.h); nullptr in a region
    // made before them.
    iprobe_rt_exit_marks* exit_marks(std::uint32_t slot) const;

    // Has any page of [p, p + size) (inside the mapping) ever been written?
    // Readers skip what was never touched rather than fault it in.
    bool touched(const void* p, std::size_t size) const;
    // Per page from the page holding p: was it ever written (1) or not (0)?
    std::vector<unsigned char> touched_pages(const void* p, std::size_t size) const;

    // Insert-only: an existing key is left alone.
    void insert_site(std::uint64_t return_address, std::uint32_t probe, std::uint32_t stat);

private:
    static Region map(UniqueFd fd, std::uint64_t size, const iprobe_rt_control& geometry);

    iprobe_rt_control* control_ = nullptr;
    std::uint64_t size_ = 0;
    iprobe_rt_control geometry_{};  // validated copy: offsets, capacities, strides
    UniqueFd fd_;
};

// The probe list of the module at `path`: the file itself when it is a list,
// else its side list (FILE.probes), else its embedded section, else the list
// derived from its symbols.  Only regular
// files are opened (never a FIFO or a device), and a list file is read only
// up to a bounded size.
std::optional<probelist::ProbeList> probe_list_at(const std::string& path);
// The same without the list derived from the symbols of a file nobody
// prepared (which sweeps all its code: seconds for libc and libstdc++), for
// scans over every module a process has loaded.
std::optional<probelist::ProbeList> prepared_probe_list_at(const std::string& path);

// The probe list a region's module was enabled from: probe_list_at() the
// path the region records, only if that file belongs to root or to the
// caller (the region's owner may have written the path) and only if it
// describes the build-id the region records; nullopt otherwise.
std::optional<probelist::ProbeList> module_probe_list(const iprobe_rt_module& module);

}  // namespace iprobe::hotpatch
