// The attacher's and reader's view of a process's shared-memory region
// (layout: iprobe/rt_layout.h).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "iprobe/rt_layout.h"

namespace iprobe::hotpatch {

struct RegionGeometry {
    std::uint32_t probe_capacity = 0;
    std::uint32_t module_capacity = 64;
    std::uint32_t ring_count = 512;
    std::uint32_t ring_records = 1u << 16;
};

struct TscCalibration {
    std::uint64_t hz = 0, tsc_base = 0, realtime_ns_base = 0;
};
// Measures the TSC rate (20 ms): do it before stopping the target.
TscCalibration calibrate_tsc();

class Region {
public:
    // Creates /dev/shm/iprobe.<pid> (mode 0600, owned by the target's uid),
    // replacing a stale one; fills the control block.
    static Region create(pid_t pid, uid_t uid, gid_t gid, const RegionGeometry& geometry,
                         const TscCalibration& tsc);
    // Opens an existing region; throws Error(not_found) when absent.
    static Region open(pid_t pid);
    static bool exists(pid_t pid);
    static void remove(pid_t pid);
    static std::string path(pid_t pid);

    Region() = default;
    Region(Region&& other) noexcept;
    Region& operator=(Region&& other) noexcept;
    ~Region();

    iprobe_rt_control* control() const { return control_; }
    iprobe_rt_module* modules() const;
    iprobe_rt_probe* probes() const;
    std::uint64_t* counts() const;
    iprobe_rt_site* sites() const;
    iprobe_rt_ring* ring(std::uint32_t index) const;
    iprobe_rt_record* records(std::uint32_t index) const;

    // Insert-only: an existing key is left alone.
    void insert_site(std::uint64_t return_address, std::uint32_t probe);

    static Region adopt(iprobe_rt_control* base, std::size_t size);

private:
    iprobe_rt_control* control_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace iprobe::hotpatch
