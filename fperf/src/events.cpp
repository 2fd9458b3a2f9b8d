#include "fperf/events.hpp"

#include <papi.h>

#include "fperf/shm_layout.h"
#include "iprobe/support/error.h"

namespace fperf {

namespace {

void init_papi() {
    static const int version = PAPI_library_init(PAPI_VER_CURRENT);
    if (version != PAPI_VER_CURRENT)
        throw iprobe::Error(std::string("PAPI initialisation failed: ") + PAPI_strerror(version),
                            iprobe::ExitCode::unavailable);
}

// PAPI_OK when `names` can be counted together in one event set.
int try_count(const std::vector<std::string>& names) {
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

std::string reason_for(const std::string& name, int rc) {
    int code = 0;
    if (PAPI_event_name_to_code(name.c_str(), &code) != PAPI_OK)
        return "PAPI knows no event by this name (see `papi_avail` and `papi_native_avail`)";
    if (rc == PAPI_ENOEVNT || rc == PAPI_ECNFLCT || rc == PAPI_EINVAL || rc == PAPI_ESYS)
        return std::string("cannot be counted on this machine (") + PAPI_strerror(rc) +
               "; no hardware PMU, or counters exhausted)";
    return PAPI_strerror(rc);
}

}  // namespace

const std::vector<std::string>& default_events() {
    static const std::vector<std::string> events = {
        "PAPI_TOT_CYC", "PAPI_TOT_INS", "PAPI_L1_DCM", "perf::PAGE-FAULTS", "perf::CONTEXT-SWITCHES"};
    return events;
}

EventChoice resolve_events(const std::vector<std::string>& requested) {
    init_papi();
    EventChoice choice;
    for (const auto& name : requested) {
        bool duplicate = false;
        for (const auto& m : choice.measured) duplicate |= m == name;
        if (duplicate) continue;
        if (choice.measured.size() >= FPERF_MAX_EVENTS) {
            choice.unavailable.push_back({name, "more than " + std::to_string(FPERF_MAX_EVENTS) + " events asked for"});
            continue;
        }
        auto with = choice.measured;
        with.push_back(name);
        const int alone = try_count({name});
        if (alone != PAPI_OK) {
            choice.unavailable.push_back({name, reason_for(name, alone)});
            continue;
        }
        const int together = try_count(with);
        if (together != PAPI_OK) {
            choice.unavailable.push_back({name, std::string("cannot be counted together with the events before it (") +
                                                    PAPI_strerror(together) + ")"});
            continue;
        }
        choice.measured.push_back(name);
    }
    return choice;
}

std::vector<std::string> available_events() {
    init_papi();
    std::vector<std::string> out;
    int code = PAPI_PRESET_MASK;
    if (PAPI_enum_event(&code, PAPI_ENUM_FIRST) == PAPI_OK) {
        do {
            PAPI_event_info_t info;
            if (PAPI_get_event_info(code, &info) == PAPI_OK && info.count > 0 && try_count({info.symbol}) == PAPI_OK)
                out.emplace_back(info.symbol);
        } while (PAPI_enum_event(&code, PAPI_PRESET_ENUM_AVAIL) == PAPI_OK);
    }
    for (int cid = 0; cid < PAPI_num_components(); cid++) {
        code = PAPI_NATIVE_MASK;
        if (PAPI_enum_cmp_event(&code, PAPI_ENUM_FIRST, cid) != PAPI_OK) continue;
        do {
            char name[PAPI_MAX_STR_LEN];
            if (PAPI_event_code_to_name(code, name) == PAPI_OK && try_count({name}) == PAPI_OK) out.emplace_back(name);
        } while (PAPI_enum_cmp_event(&code, PAPI_ENUM_EVENTS, cid) == PAPI_OK);
    }
    return out;
}

}  // namespace fperf
