/* fperf's entry points for NOP-form sites: every register saved around the
 * C handler, which gets the site's return address and stack pointer.
 * Function-entry sites (the entry and LLVM flows) have their own calling
 * convention (ENTRY_SITE_CALL): fperf_entry_enter_return's exits come
 * through the runtime's return trampolines. */
    .text

#include "iprobe/runtime/save_call_restore.inc"

SAVE_CALL_RESTORE fperf_enter_nop, fperf_enter_at, 0, 0
SAVE_CALL_RESTORE fperf_exit_nop,  fperf_exit_at,  0, 0
ENTRY_SITE_CALL fperf_entry_enter, fperf_entry_enter_at
ENTRY_SITE_CALL fperf_entry_enter_return, fperf_entry_enter_return_at

    .section .note.GNU-stack, "", @progbits
