/* The runtime's NOP-form entry points (see save_call_restore.inc). */
    .text

#include "iprobe/runtime/save_call_restore.inc"


SAVE_CALL_RESTORE iprobe_rt_trace_enter_nop, iprobe_rt_trace_enter_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_exit_nop,  iprobe_rt_trace_exit_at,  0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_point_nop, iprobe_rt_trace_point_at, 1, 1
SAVE_CALL_RESTORE iprobe_rt_count_enter_nop, iprobe_rt_count_enter_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_exit_nop,  iprobe_rt_count_exit_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_point_nop, iprobe_rt_count_point_at, 1, 0

    .section .note.GNU-stack, "", @progbits
