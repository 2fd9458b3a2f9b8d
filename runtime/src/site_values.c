/* Values in the -finstrument-functions flow: the site's recipe
 * (rt_layout.h, iprobe_rt_site_recipe) turned into the argument registers
 * the reader types by, from the registers site_values.S laid out.  Memory
 * is read only at the stack pointer or the frame pointer carrying the CFA
 * (the function's own frame, mapped), within a bounded offset. */
#include <stdint.h>

#include "iprobe/formats/rt_layout.h"

#define FRAME_WORDS 33     /* DWARF registers 0-32 (site_values.S) */
#define DWARF_RSP 7
#define DWARF_RBP 6
#define MEMORY_REACH 4096  /* bytes either side of the base a recipe may read */

const struct iprobe_rt_site_recipe* iprobe_rt_site_recipe(uint32_t id, uint64_t* word);
void iprobe_rt_site_values_enter_at(uint32_t id, uint64_t word, const uint64_t* saved, const uint64_t* xmm,
                                    uint64_t* slot);
void iprobe_rt_trace_enter_id(uint32_t probe);

static inline __attribute__((always_inline)) uint64_t follow(struct iprobe_rt_location at, const uint64_t* frame) {
    const uint32_t kind = IPROBE_RT_LOC_KIND(at.kind);
    if (kind == IPROBE_RT_LOC_CONST) return (uint64_t)(int64_t)at.offset;
    if (at.reg >= FRAME_WORDS) return 0;
    const uint64_t base = frame[at.reg];
    if (kind == IPROBE_RT_LOC_REG) return base;
    if (kind == IPROBE_RT_LOC_VALUE) return base + (uint64_t)(int64_t)at.offset;
    if (kind != IPROBE_RT_LOC_MEMORY || (at.reg != DWARF_RSP && at.reg != DWARF_RBP) || at.offset > MEMORY_REACH ||
        at.offset < -MEMORY_REACH)
        return 0;
    const uintptr_t p = (uintptr_t)(base + (uint64_t)(int64_t)at.offset);
    switch (IPROBE_RT_LOC_SIZE(at.kind)) {
    case 1: return *(const volatile uint8_t*)p;
    case 2: return *(const volatile uint16_t*)p;
    case 4: return *(const volatile uint32_t*)p;
    case 8: return *(const volatile uint64_t*)p;
    default: return 0;
    }
}

__attribute__((visibility("hidden"))) void iprobe_rt_site_values_enter(uint32_t id, const uint64_t* frame) {
    uint64_t word = 0;
    const struct iprobe_rt_site_recipe* r = iprobe_rt_site_recipe(id, &word);
    if (!r) {
        iprobe_rt_trace_enter_id(id);
        return;
    }
    /* as ENTRY_SITE_CALL saves them: rdi, rsi, rdx, rcx, (rax), r8, r9 */
    static const int8_t saved_index[IPROBE_RT_VALUES_GPRS] = {0, 1, 2, 3, 5, 6};
    uint64_t saved[7], xmm[IPROBE_RT_VALUES_XMMS];
    /* Each word written once (an initializer would be a `rep stos`, whose
     * start-up was a fifth of this function); most slots are unused (kind
     * 0): one load and branch each. */
    saved[4] = 0;
    for (int i = 0; i < IPROBE_RT_VALUES_GPRS; i++)
        saved[saved_index[i]] = r->gpr[i].kind ? follow(r->gpr[i], frame) : 0;
    for (int i = 0; i < IPROBE_RT_VALUES_XMMS; i++) xmm[i] = r->xmm[i].kind ? follow(r->xmm[i], frame) : 0;
    uint64_t* slot = 0;
    if (IPROBE_RT_LOC_KIND(r->return_slot.kind) == IPROBE_RT_LOC_VALUE)
        slot = (uint64_t*)(uintptr_t)follow(r->return_slot, frame);
    /* the function's own frame, above the site's stack pointer */
    if (((uintptr_t)slot & 7) != 0 || (uint64_t)(uintptr_t)slot < frame[DWARF_RSP] ||
        (uint64_t)(uintptr_t)slot - frame[DWARF_RSP] > MEMORY_REACH)
        slot = 0;
    iprobe_rt_site_values_enter_at(id, word, saved, xmm, slot);
}

