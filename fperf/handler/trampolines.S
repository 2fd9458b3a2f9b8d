/* fperf's entry points for NOP-form sites (iprobe-cc --mode=llvm): every
 * register saved around the C handler, which gets the site's return address. */
    .text

#include "iprobe/runtime/save_call_restore.inc"

SAVE_CALL_RESTORE fperf_enter_nop, fperf_enter_at, 0, 0
SAVE_CALL_RESTORE fperf_exit_nop,  fperf_exit_at,  0, 0

    .section .note.GNU-stack, "", @progbits
