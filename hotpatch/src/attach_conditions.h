// `--when` / `--min-duration` / the return-value histogram at attach: compiled
// per selected function before anything is written (a refusal changes
// nothing), then written into the region and switched on per function.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "attach_plan.h"
#include "iprobe/hotpatch/condition.h"
#include "iprobe/hotpatch/hotpatch.h"
#include "region.h"

namespace iprobe::hotpatch {

// What one selected function gets.
struct FunctionCondition {
    iprobe_cond_program program{};  // op_count 0: none
    std::uint8_t retval_hist = 0;   // iprobe_rt_probe.retval_hist
    // An inlined copy where a parameter the condition names is optimized
    // out: its program never holds (its calls counted, none recorded).
    bool undecidable = false;
};

// Per list, per entry probe id: the condition the attach gives it.
using ConditionPlan = std::vector<std::map<std::uint32_t, FunctionCondition>>;

// The parsed --when and --min-duration together (empty when neither):
// ConditionError (exit 3) on a syntax error.
Condition attach_condition(const AttachOptions& options);

// Compiles `condition` for every selected function-entry probe of `lists`
// (their modules' DWARF, as the target sees its files), before the target
// stops.  Throws Error(bad_input) naming
// every function that lacks a name the condition uses and what it has,
// Error(usage) when a condition needs what the selection cannot give
// (a retval or duration without exit probes; sites other than function
// entries).
ConditionPlan plan_conditions(const Condition& condition, const AttachOptions& options,
                              const std::vector<SelectedList>& lists);

// One selected function's condition as the stop writes it: `global` is its
// entry probe in the region, `program` points into the ConditionPlan (which
// must outlive it), null for none.
struct ConditionStore {
    std::uint32_t global = 0;
    const iprobe_cond_program* program = nullptr;
    std::uint8_t retval_hist = 0;
};

// The plan flattened, in the region's probe order, before the stop: the
// stop then walks one vector instead of a map node per function (cold in
// the cache by then: ~0.3 ms of a 10k-probe pause).
std::vector<ConditionStore> condition_stores(const ConditionPlan& plan, const std::vector<std::uint32_t>& first_probes);

// Writes each function's program (reusing an identical one the region
// holds), then sets the entry probe's condition and its exit probe's
// retval_hist: one store each, so a running thread sees the old or the new.
void apply_conditions(Region& region, const std::vector<ConditionStore>& stores);

}  // namespace iprobe::hotpatch
