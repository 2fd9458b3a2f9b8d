// In-memory probe list and its (de)serialisation to the format defined in
// iprobe/probe_list.h.  Used by coldpatch and the LLVM flow (writers) and by
// hotpatch, trace, report, fperf and `iprobe list` (readers).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "iprobe/formats/probe_list.h"

namespace iprobe::probelist {

enum class ProbeKind : std::uint8_t {
    entry = IPROBE_KIND_ENTRY,
    exit = IPROBE_KIND_EXIT,
    point = IPROBE_KIND_POINT,
};

enum class SiteForm : std::uint8_t {
    call_rel32 = IPROBE_SITE_CALL_REL32,
    call_rip_indirect = IPROBE_SITE_CALL_RIPIND,
    nop = IPROBE_SITE_NOP,
    ret = IPROBE_SITE_RETURN,  // an exit served by its entry site's return trampoline
};

std::string_view to_string(SiteForm form);

std::string_view to_string(ProbeKind kind);
// enum iprobe_flow as users spell it (iprobe-cc --flow=): "finstrument" | "entry" | "llvm".
std::string_view flow_name(std::uint32_t flow);
// "entry" | "exit" | "point"; throws Error(usage) otherwise.
ProbeKind parse_probe_kind(std::string_view text);

struct Probe {
    std::uint32_t id = 0;
    ProbeKind kind = ProbeKind::entry;
    SiteForm form = SiteForm::call_rel32;
    std::uint8_t size = 5;
    bool shared_site = false;         // IPROBE_PL_RECORD_SHARED_SITE
    bool relocated = false;           // IPROBE_PL_RECORD_RELOCATED (entry only): no pad, `moved` when enabled
    std::uint64_t site = 0;           // link-time vaddr
    std::uint64_t function_address = 0;
    std::string function;             // raw symbol
    std::string demangled;            // == function for C
    std::string file;                 // empty when unknown
    std::uint32_t line = 0;
    std::array<std::uint8_t, IPROBE_PL_SITE_MAX> original{};
    std::array<std::uint8_t, IPROBE_PL_SITE_MAX> placeholder{};
    // A relocated entry (flow IPROBE_FLOW_UNPREPARED, or an unpadded function
    // of the entry flow): the function's first instructions from the site
    // on, as the file holds them, which its trampoline runs
    // (relocate/entry_relocation.h).  Empty otherwise, and for a list read
    // without its binary.
    std::vector<std::uint8_t> moved;
};

// A function of an unprepared binary that has no probe, and why.
struct RefusedFunction {
    std::string function, demangled;
    std::uint64_t address = 0, size = 0;
    std::string reason;  // relocate::to_string(Refusal): "too short", "branch into entry", ...
    std::string detail;  // what was found
};

// A function-entry site that can hook returns: the NOP-form entry probe at
// `index` followed by its exit probe of form `ret` (then index + 1).
bool serves_returns(const std::vector<struct Probe>& probes, std::size_t index);

struct ProbeList {
    std::uint32_t flags = 0;          // enum iprobe_pl_flags
    std::uint32_t flow = IPROBE_FLOW_FINSTRUMENT;
    std::string module;               // path or soname
    std::vector<std::uint8_t> build_id;
    std::uint64_t enter_target = 0, exit_target = 0;
    std::uint64_t enter_got_slot = 0, exit_got_slot = 0;
    std::vector<Probe> probes;        // sorted by site, id == index
    // The function symbols that got no probe (flow IPROBE_FLOW_UNPREPARED,
    // and unpadded functions of the entry flow when read with the binary).
    std::vector<RefusedFunction> refused;

    // Sorts by site address and renumbers ids so they are stable per build.
    void normalize();

    std::vector<std::uint8_t> serialize() const;
    static ProbeList deserialize(std::span<const std::uint8_t> bytes, const std::string& origin);

    void save(const std::string& path) const;      // atomic
    static ProbeList load(const std::string& path);

    std::string build_id_hex() const;
    // Has entries relocated when enabled (a trampoline slot each).
    bool has_relocated() const;
};

// Which probes a user asked for.  Empty lists mean "all".
struct ProbeSelector {
    std::vector<std::string> function_globs;  // matched against demangled and raw names
    std::vector<std::string> file_globs;      // matched against the source path and its basename
    std::vector<ProbeKind> kinds;

    bool matches(const Probe& probe) const;
    std::vector<const Probe*> select(const ProbeList& list) const;
};

// A selector prepared for many probes: function names without pattern
// characters (thousands, when a session names its functions one by one)
// are looked up, not matched one by one.  Keeps a reference to `selector`.
class ProbeMatcher {
public:
    explicit ProbeMatcher(const ProbeSelector& selector);
    bool matches(const Probe& probe) const;

private:
    const ProbeSelector& selector_;
    std::unordered_set<std::string_view> names_;
    std::vector<std::string_view> patterns_;
};

std::string hex(std::span<const std::uint8_t> bytes);

}  // namespace iprobe::probelist
