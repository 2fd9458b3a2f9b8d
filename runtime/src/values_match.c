/* The --when / --min-duration hook (values_match.h): the function's compiled
 * condition (iprobe/formats/condition.h, evaluated by condition_eval.h);
 * without one every event is recorded, an exit when its entry was. */
#include "values_match.h"

#include "condition.h"

int iprobe_rt_values_match(const struct iprobe_rt_control* cb, uint32_t probe, struct iprobe_rt_values_spec spec,
                           const struct iprobe_rt_values* v) {
    /* an exit's condition is its entry's: the probe before, or spec.distance back */
    const uint32_t back = spec.distance ? spec.distance : 1;
    return iprobe_rt_condition_match(cb, v->kind == IPROBE_RT_REC_EXIT && probe >= back ? probe - back : probe, v);
}
