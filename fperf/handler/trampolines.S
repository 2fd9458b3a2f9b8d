/* fperf's entry points for NOP-form sites (the LLVM and entry flows): every
 * register saved around the C handler, which gets the site's return address
 * and stack pointer.  fperf_enter_return_nop serves a function-entry site
 * whose exit comes through the runtime's return trampolines. */
    .text

#include "iprobe/runtime/save_call_restore.inc"

SAVE_CALL_RESTORE fperf_enter_nop, fperf_enter_at, 0, 0
SAVE_CALL_RESTORE fperf_exit_nop,  fperf_exit_at,  0, 0
SAVE_CALL_RESTORE fperf_enter_return_nop, fperf_enter_return_at, 0, 0

    .section .note.GNU-stack, "", @progbits
