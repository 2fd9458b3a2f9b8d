/*
 * Return trampolines (see return_stack.h): the sled every hooked return goes
 * through, its common tail, and the count handler's entry points for
 * function-entry sites, whose fast paths are here in full.
 *
 * Registers.  At a function-entry site every argument register is live
 * (rdi, rsi, rdx, rcx, r8, r9, rax for varargs, r10 for a static chain,
 * xmm0-7) and r11 is free: a site's stub passes its id in r11d.  gcc gives
 * up interprocedural register allocation for functions with a patchable
 * entry, so a caller keeps nothing in a call-clobbered register across the
 * call.  On return only rax, rdx, xmm0, xmm1, st0 and st1 may be live; the
 * runtime's C code is built with -mgeneral-regs-only and uses no x87, so
 * the common tail saves rax, rdx, xmm0 and xmm1 around it.
 */
#include "return_stack.h"
#include "iprobe/runtime/save_call_restore.inc"

    .text

/* ---- the sled ----
 * Unit i: `call iprobe_rt_return_common`, then the self-relative address of
 * pool entry i at unit + 8.  The FDE describes a unit as a frame of its own
 * whose caller's pc is the entry's real return address:
 *   CFA = rsp + 8, the caller's rsp = CFA - 8 (what rsp was right after the
 *   hooked function returned: a distinct CFA, so libgcc's phase 2 never
 *   mistakes the unit for the frame that catches),
 *   ra  = *( (U + 8) + *(U + 8) ) with U = (return address column) & -16:
 *     DW_OP_breg16 0; DW_OP_const1s -16; DW_OP_and; DW_OP_plus_uconst 8;
 *     DW_OP_dup; DW_OP_deref; DW_OP_plus; DW_OP_deref
 * The return address column holds the unit itself when the unit is reached
 * by the hooked function's `ret`, or unit + 5 when the unwinder comes from
 * inside the common tail: both round down to the unit.  The FDE starts 16
 * bytes early so that unit 0's address minus one (what an unwinder looks up)
 * is covered. */
    .p2align 4
    /* exported: backtrace_symbols() and dladdr() name hooked returns by it */
    .globl iprobe_rt_return_trampolines
    .type iprobe_rt_return_trampolines, @function
iprobe_rt_return_trampolines:
    .cfi_startproc
    .cfi_def_cfa rsp, 8
    .cfi_val_offset rsp, -8
    .cfi_escape 0x16, 0x10, 11, 0x80, 0x00, 0x09, 0xf0, 0x1a, 0x23, 0x08, 0x12, 0x06, 0x22, 0x06
    .fill 16, 1, 0xcc
    .globl iprobe_rt_return_sled
    .hidden iprobe_rt_return_sled
iprobe_rt_return_sled:
    .set unit, 0
    .rept IPROBE_RT_RETURN_ENTRIES
    call iprobe_rt_return_common
    .byte 0xcc, 0xcc, 0xcc
    .quad iprobe_rt_return_pool + IPROBE_RT_RETURN_ENTRY_SIZE * unit - .
    .set unit, unit + 1
    .endr
    .cfi_endproc
    .size iprobe_rt_return_trampolines, . - iprobe_rt_return_trampolines

/* ---- the common tail ----
 * Entered from a unit with [rsp] = unit + 5 and rsp = the slot the hooked
 * function returned from.  Records the exit, frees the entry (pops it when
 * it is the thread's top one, the LIFO case; otherwise it stays a hole for
 * the slow path to compact) and jumps to the real return address. */
    .p2align 4
    .globl iprobe_rt_return_common
    .hidden iprobe_rt_return_common
    .type iprobe_rt_return_common, @function
iprobe_rt_return_common:
    .cfi_startproc
    mov (%rsp), %r11
    and $-IPROBE_RT_RETURN_UNIT_SIZE, %r11
    mov 8(%r11), %rcx
    lea 8(%r11,%rcx), %r11
    cmpl $IPROBE_RT_RETURN_COUNT, RET_ENTRY_HANDLER(%r11)
    jne .Lrecord_in_c
    mov iprobe_rt_thread@gottpoff(%rip), %rcx
    mov %fs:RET_THREAD_STATS(%rcx), %rcx
    test %rcx, %rcx
    jz .Lrecorded
    mov RET_ENTRY_ARG(%r11), %esi
    addq $1, (%rcx,%rsi)
.Lrecorded:
    mov RET_ENTRY_RET(%r11), %rcx
    lea 8(%rsp), %rsp
    .cfi_remember_state
    .cfi_def_cfa rsp, 0
    .cfi_register rip, rcx
    movq $0, RET_ENTRY_RET(%r11)
    mov iprobe_rt_thread@gottpoff(%rip), %rsi
    lea IPROBE_RT_RETURN_ENTRY_SIZE(%r11), %rdi
    cmp %fs:RET_THREAD_NEXT(%rsi), %rdi
    jne 1f
    mov %r11, %fs:RET_THREAD_NEXT(%rsi)
1:  jmp *%rcx
    .cfi_restore_state
.Lrecord_in_c:
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset rbp, -16
    mov %rsp, %rbp
    .cfi_def_cfa_register rbp
    push %rbx
    .cfi_offset rbx, -24
    push %rax
    push %rdx
    mov %r11, %rbx
    and $-16, %rsp
    sub $32, %rsp
    movdqa %xmm0, 0(%rsp)
    movdqa %xmm1, 16(%rsp)
    mov %r11, %rdi
    call iprobe_rt_return_at
    movdqa 0(%rsp), %xmm0
    movdqa 16(%rsp), %xmm1
    mov %rbx, %r11
    lea -24(%rbp), %rsp
    pop %rdx
    pop %rax
    pop %rbx
    .cfi_restore rbx
    pop %rbp
    .cfi_restore rbp
    .cfi_def_cfa rsp, 8
    jmp .Lrecorded
    .cfi_endproc
    .size iprobe_rt_return_common, . - iprobe_rt_return_common

/* ---- the count handler at function-entry sites ----
 * r11d: the byte offset of the function's `calls` in a thread's sums (its
 * `completed` follows it).  Fast path: the thread has its sums and room in
 * its chunk; everything else goes to C through SAVE_CALL_RESTORE. */
.macro COUNT_ENTRY name, slow, count_call
    .p2align 4
    .globl \name
    .type \name, @function
\name:
    .cfi_startproc
    push %rax
    .cfi_adjust_cfa_offset 8
    push %rcx
    .cfi_adjust_cfa_offset 8
    /* [rsp] rcx, [8] rax, [16] back into the function, [24] its return address */
    mov iprobe_rt_thread@gottpoff(%rip), %rax
    cmpq $0, %fs:RET_THREAD_STATS(%rax)
    je 1f
    mov %fs:RET_THREAD_NEXT(%rax), %rcx
    cmp %fs:RET_THREAD_LIMIT(%rax), %rcx
    jae 1f
    /* one instruction: a signal handler hooking in this thread nests above */
    addq $IPROBE_RT_RETURN_ENTRY_SIZE, %fs:RET_THREAD_NEXT(%rax)
.if \count_call
    mov %fs:RET_THREAD_STATS(%rax), %rax
    addq $1, (%rax,%r11)
.endif
    mov 24(%rsp), %rax
    mov %rax, RET_ENTRY_RET(%rcx)
    lea 24(%rsp), %rax
    mov %rax, RET_ENTRY_SLOT(%rcx)
    lea 8(%r11), %rax
    shl $32, %rax
    or $IPROBE_RT_RETURN_COUNT, %rax
    mov %rax, RET_ENTRY_HANDLER(%rcx)
    /* its unit: sled + (entry - pool) / 2 */
    lea iprobe_rt_return_pool(%rip), %rax
    sub %rax, %rcx
    shr $1, %rcx
    lea iprobe_rt_return_sled(%rip), %rax
    add %rax, %rcx
    /* last: until now the function returns as it would have */
    mov %rcx, 24(%rsp)
    pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
    ret
1:  pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
    jmp \slow
    .cfi_endproc
    .size \name, . - \name
.endm

COUNT_ENTRY iprobe_rt_count_enter_return_nop, iprobe_rt_count_enter_return_slow, 1
COUNT_ENTRY iprobe_rt_count_return_nop, iprobe_rt_count_return_slow, 0

/* Slow paths and the trace handler's entry points: every register saved,
 * the site's id is the saved r11 (saved[8]), the site's stack pointer before
 * its call (rdx) is the function's return-address slot. */
SAVE_CALL_RESTORE iprobe_rt_count_enter_return_slow, iprobe_rt_count_enter_return_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_return_slow, iprobe_rt_count_return_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_counter_nop, iprobe_rt_count_counter_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_enter_id_nop, iprobe_rt_trace_enter_id_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_return_nop, iprobe_rt_trace_return_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_enter_return_nop, iprobe_rt_trace_enter_return_at, 0, 0

    .section .note.GNU-stack, "", @progbits
