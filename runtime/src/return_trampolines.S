/*
 * Return trampolines (see return_stack.h): the sled every hooked return goes
 * through, its common tail, and the count handler's entry points for
 * function-entry sites, whose fast paths are here in full.
 *
 * Registers.  gcc's interprocedural register allocation (IPA-RA, kept by
 * iprobe-cc's gcc plugin) lets a caller keep values in any register the
 * called function leaves alone, call-clobbered ones included.  So an
 * enabled entry and a hooked return change no general register the
 * function would not: the entry stub passes the site's end and id on the
 * stack (ENTRY_SITE_CALL in save_call_restore.inc), a unit keeps the
 * caller's r11 in the red zone while r11 names the unit, and the common tail
 * saves every register it or the C it calls may touch.  Vector registers:
 * the runtime's C code is built with -mgeneral-regs-only and uses no x87;
 * it calls libc, and other handlers' callbacks, only through
 * iprobe_rt_vector_safe_call, which keeps xmm0-15.  Flags are not kept: gcc
 * keeps no comparison live across a call.
 */
#include "return_stack.h"
#include "trace_fast.h"
#include "iprobe/formats/condition.h"
#include "iprobe/runtime/save_call_restore.inc"

    .text

/* ---- the sled ----
 * The FDE describes a unit (from its trampoline on) as a frame of its own
 * whose caller's pc is the entry's real return address:
 *   CFA = rsp + 8, the caller's rsp = CFA - 8 (rsp right after the hooked
 *   function returned: a CFA distinct from the hooked function's, so
 *   libgcc's phase 2 never takes the unit for the frame that catches),
 *   ra = *(A + *A), A = ((return address column) & -32) + 24:
 *     DW_OP_breg16 0; DW_OP_const1s -32; DW_OP_and; DW_OP_plus_uconst 24;
 *     DW_OP_dup; DW_OP_deref; DW_OP_plus; DW_OP_deref
 * The return address column holds the trampoline (unit + 4) when an unwinder
 * comes from the hooked function, or the unit itself in a signal frame
 * stopped on its first instruction (the slot still holds the real address
 * then, which the entry holds too): both round down to the unit.  The FDE
 * starts 32 bytes early so that unit 0's trampoline minus one is covered.
 * A unit: `call *-16(%rsp)` enters the function at the site's end (left
 * there by ENTRY_SITE_GO_ON) and writes the trampoline into the return slot;
 * on return, the caller's r11 goes to the red zone and r11 names the unit. */
    .p2align 5
    /* exported: backtrace_symbols() and dladdr() name hooked returns by it */
    .globl iprobe_rt_return_trampolines
    .type iprobe_rt_return_trampolines, @function
iprobe_rt_return_trampolines:
    .cfi_startproc
    /* CFA = rsp + 8 - n, n the trampolines still ahead in this unit's chain
     * (a tail call whose caller and callee both hook the one slot chains
     * their entries: e->ret is another unit's trampoline), at most 7: each
     * unit of a chain is a frame of its own, nearer the caller the further
     * out, never sharing a CFA with another (libgcc's phase 2 finds the
     * handler's frame by its CFA; gdb stops at a repeated frame id).  A
     * trampoline is an address IPROBE_RT_RETURN_UNIT_TRAMPOLINE past a 32-byte boundary whose unit holds
     * the same self-relative pointer as this one (entries and units are
     * both 32 bytes: every unit holds the same value).
     *   breg7 8; breg16 0; dup; const1s -32; and; plus_uconst UNIT_ENTRY; deref; swap   [c K t]
     *   loop: const1s -32; and; plus_uconst UNIT_ENTRY; dup; deref; plus; deref     [c K t']
     *         dup; lit31; and; lit<UNIT_TRAMPOLINE>; ne; bra done
     *         dup; const1s -32; and; plus_uconst UNIT_ENTRY; deref; pick 2; ne; bra done
     *         rot; rot; lit1; minus; rot                                  [c-1 K t']
     *         pick 2; breg7 1; eq; bra done; skip loop
     *   done: drop; drop                                                  [c]
     * The caller's rsp is this frame's (the hooked function has returned). */
    .cfi_escape 0x0f, 60, 0x77, 0x08, 0x80, 0x00, 0x12, 0x09, 0xe0, 0x1a, 0x23, IPROBE_RT_RETURN_UNIT_ENTRY, 0x06, 0x16, 0x09, 0xe0, 0x1a, 0x23, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06, 0x12, 0x4f, 0x1a, 0x30 + IPROBE_RT_RETURN_UNIT_TRAMPOLINE, 0x2e, 0x28, 0x1d, 0x00, 0x12, 0x09, 0xe0, 0x1a, 0x23, IPROBE_RT_RETURN_UNIT_ENTRY, 0x06, 0x15, 0x02, 0x2e, 0x28, 0x10, 0x00, 0x17, 0x17, 0x31, 0x1c, 0x17, 0x15, 0x02, 0x77, 0x01, 0x29, 0x28, 0x03, 0x00, 0x2f, 0xd2, 0xff, 0x13, 0x13
    .cfi_escape 0x16, 0x07, 2, 0x77, 0x00
    .cfi_escape 0x16, 0x10, 11, 0x80, 0x00, 0x09, 0xe0, 0x1a, 0x23, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06
    .fill IPROBE_RT_RETURN_UNIT_SIZE, 1, 0xcc
    .globl iprobe_rt_return_sled
    .hidden iprobe_rt_return_sled
iprobe_rt_return_sled:
    .set unit, 0
    .rept IPROBE_RT_RETURN_ENTRIES
0:  call *-16(%rsp)
    mov %r11, -8(%rsp)
    lea 0b(%rip), %r11
    .byte 0xe9                                   /* jmp rel32: every unit the same size */
    .long iprobe_rt_return_common - (. + 4)
    .fill IPROBE_RT_RETURN_UNIT_ENTRY - (. - 0b), 1, 0xcc
    .quad iprobe_rt_return_pool + IPROBE_RT_RETURN_ENTRY_SIZE * unit - .
    .fill IPROBE_RT_RETURN_UNIT_SIZE - (. - 0b), 1, 0xcc
    .set unit, unit + 1
    .endr
    .cfi_endproc
    .size iprobe_rt_return_trampolines, . - iprobe_rt_return_trampolines

/* ---- the common tail ----
 * Entered by a unit's jump with r11 = the unit, rsp = what the hooked
 * function's caller had and the caller's r11 just below it.  Records the
 * exit, frees the entry (pops it when it is the thread's top one, the LIFO
 * case; otherwise it stays a hole for the slow path to find) and returns to
 * the real return address with a `ret` from where the caller's r11 was, so
 * that the caller's own entry of the return stack buffer is used.  Every
 * register is as the function left it then.
 * CFI as for a unit, from r11 (rbx while C runs): the entry's return address. */
    .p2align 4
    .globl iprobe_rt_return_common
    .hidden iprobe_rt_return_common
    .type iprobe_rt_return_common, @function
iprobe_rt_return_common:
    .cfi_startproc
    .cfi_def_cfa rsp, 8
    .cfi_val_offset rsp, -8
    /* ra = *(A + *A), A = r11 + IPROBE_RT_RETURN_UNIT_ENTRY */
    .cfi_escape 0x16, 0x10, 6, 0x7b, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06
    lea -8(%rsp), %rsp                 /* [rsp] = the caller's r11 */
    .cfi_adjust_cfa_offset 8
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %rsi
    .cfi_adjust_cfa_offset 8
    push %rcx
    .cfi_adjust_cfa_offset 8
    push %r8
    .cfi_adjust_cfa_offset 8
    /* [rsp] r8, [8] rcx, [16] rsi, [24] rdi, [32] the caller's r11 */
    mov IPROBE_RT_RETURN_UNIT_ENTRY(%r11), %rdi
    lea IPROBE_RT_RETURN_UNIT_ENTRY(%r11,%rdi), %rdi
    cmpl $IPROBE_RT_RETURN_COUNT, RET_ENTRY_HANDLER(%rdi)
    jne iprobe_rt_trace_exit_fast      /* trace_fast.S: the trace handler's, or back to C here */
    mov iprobe_rt_thread@gottpoff(%rip), %rcx
    mov %fs:RET_THREAD_STATS(%rcx), %rcx
    test %rcx, %rcx
    jz .Lrecorded
    mov RET_ENTRY_ARG(%rdi), %esi
    addq $1, (%rcx,%rsi)
    .globl iprobe_rt_return_recorded
    .hidden iprobe_rt_return_recorded
iprobe_rt_return_recorded:
.Lrecorded:
    mov RET_ENTRY_RET(%rdi), %rcx
    .cfi_remember_state
    .cfi_register rip, rcx
    movq $0, RET_ENTRY_RET(%rdi)
    mov iprobe_rt_thread@gottpoff(%rip), %rsi
    lea IPROBE_RT_RETURN_ENTRY_SIZE(%rdi), %r8
    cmp %fs:RET_THREAD_NEXT(%rsi), %r8
    jne 1f
    mov %rdi, %fs:RET_THREAD_NEXT(%rsi)
1:  mov 32(%rsp), %r11                 /* the caller's r11 back */
    mov %rcx, 32(%rsp)                 /* and the real return address where it was */
    .cfi_offset rip, -16
    pop %r8
    .cfi_adjust_cfa_offset -8
    pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_restore_state
    .globl iprobe_rt_return_record_in_c
    .hidden iprobe_rt_return_record_in_c
iprobe_rt_return_record_in_c:
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset rbp, -56
    mov %rsp, %rbp
    .cfi_def_cfa_register rbp
    push %rbx
    .cfi_offset rbx, -64
    push %rdx
    push %rax
    push %r9
    push %r10
    mov %r11, %rbx
    /* the unit is in rbx now: ra = *(A + *A), A = rbx + IPROBE_RT_RETURN_UNIT_ENTRY */
    .cfi_escape 0x16, 0x10, 6, 0x73, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06
    and $-16, %rsp
    sub $32, %rsp
    movdqa %xmm0, 0(%rsp)
    movdqa %xmm1, 16(%rsp)
    lea -24(%rbp), %rsi                /* rax, rdx as the function returned them */
    call iprobe_rt_return_at
    movdqa 0(%rsp), %xmm0
    movdqa 16(%rsp), %xmm1
    mov %rbx, %r11
    .cfi_escape 0x16, 0x10, 6, 0x7b, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06
    lea -40(%rbp), %rsp
    pop %r10
    pop %r9
    pop %rax
    pop %rdx
    pop %rbx
    .cfi_restore rbx
    pop %rbp
    .cfi_restore rbp
    .cfi_def_cfa rsp, 48
    mov IPROBE_RT_RETURN_UNIT_ENTRY(%r11), %rdi
    lea IPROBE_RT_RETURN_UNIT_ENTRY(%r11,%rdi), %rdi
    jmp .Lrecorded
    .cfi_endproc
    .size iprobe_rt_return_common, . - iprobe_rt_return_common

/* ---- the count handler at function-entry sites ----
 * Entered as ENTRY_SITE_CALL is (save_call_restore.inc), with the id = the
 * byte offset of the function's `calls` in a thread's sums (its `completed`
 * follows it).  Fast path: the thread has its sums and room in its run of
 * entries; everything else goes to C through ENTRY_SITE_CALL. */
.macro COUNT_ENTRY name, slow, count_call
    .p2align 4
    .globl \name
    .type \name, @function
\name:
    .cfi_startproc
    .cfi_def_cfa rsp, 24
    .cfi_offset rip, -8
    push %rax
    .cfi_adjust_cfa_offset 8
    push %rcx
    .cfi_adjust_cfa_offset 8
    /* [rsp] rcx, [8] rax, [16] id, [24] the site's end, [32] the function's return address */
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
    add 16(%rsp), %rax
    addq $1, (%rax)
.endif
    mov 32(%rsp), %rax
    mov %rax, RET_ENTRY_RET(%rcx)
    lea 32(%rsp), %rax
    mov %rax, RET_ENTRY_SLOT(%rcx)
    mov 16(%rsp), %rax
    add $FAST_STATS_COMPLETED - FAST_STATS_CALLS, %rax
    shl $32, %rax
    or $IPROBE_RT_RETURN_COUNT, %rax
    mov %rax, RET_ENTRY_HANDLER(%rcx)
    RETURN_UNIT_OF %rcx, %rax
    mov %rcx, 16(%rsp)
    pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
    ENTRY_SITE_GO_ON
1:  .cfi_def_cfa_offset 40
    pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
    jmp \slow
    .cfi_endproc
    .size \name, . - \name
.endm

.if IPROBE_RT_RETURN_UNIT_SIZE - IPROBE_RT_RETURN_ENTRY_SIZE
.error "units and pool entries must be the same size"
.endif

/* ---- the trace handler's entry at function-entry sites ----
 * Entered as ENTRY_SITE_CALL is, with the id = the entry probe's global
 * index.  A function whose --when is `argN OP constant` (the program's fast
 * form, iprobe/formats/condition.h) and does not hold for this call goes on
 * as the count handler's entry does (its id replaced by the offset of the
 * function's calls): counted, its return hooked to count it completed, no
 * C.  Everything else goes to the trace handler in C, which decides again. */
    .p2align 4
    .globl iprobe_rt_trace_enter_return_nop
    .type iprobe_rt_trace_enter_return_nop, @function
iprobe_rt_trace_enter_return_nop:
    .cfi_startproc
    .cfi_def_cfa rsp, 24
    .cfi_offset rip, -8
    push %rax
    .cfi_adjust_cfa_offset 8
    push %rcx
    .cfi_adjust_cfa_offset 8
    push %rdx
    .cfi_adjust_cfa_offset 8
    push %r11
    .cfi_adjust_cfa_offset 8
    .cfi_remember_state
    /* [rsp] r11, [8] rdx, [16] rcx, [24] rax, [32] id, [40] the site's end, [48] the return slot */
    mov 32(%rsp), %eax
    cmp iprobe_rt_when_probe_capacity(%rip), %eax   /* 0 until a region is mapped */
    jae 9f
    shl $FAST_PROBE_SHIFT, %rax
    add iprobe_rt_when_probes(%rip), %rax
    movzwl FAST_PROBE_CONDITION(%rax), %ecx
    sub $1, %ecx                                    /* no condition: borrow */
    jb iprobe_rt_trace_enter_fast                   /* trace_fast.S, rax = the probe */
    cmp iprobe_rt_when_capacity(%rip), %ecx
    jae 9f
    mov FAST_PROBE_STAT(%rax), %eax
    cmp iprobe_rt_when_stat_capacity(%rip), %eax
    jae 9f
    imul $IPROBE_COND_PROGRAM_SIZE, %rcx, %rcx
    add iprobe_rt_when_programs(%rip), %rcx
    cmpb $0, IPROBE_COND_FAST(%rcx)
    je 9f
    /* r11 = the argument register the condition reads, as the function got it */
    movzbl IPROBE_COND_FAST_ARG(%rcx), %edx
    cmp $1, %edx
    jb 1f
    je 2f
    cmp $3, %edx
    jb 3f
    je 4f
    cmp $4, %edx
    je 5f
    mov %r9, %r11
    jmp 6f
1:  mov %rdi, %r11
    jmp 6f
2:  mov %rsi, %r11
    jmp 6f
3:  mov 8(%rsp), %r11
    jmp 6f
4:  mov 16(%rsp), %r11
    jmp 6f
5:  mov %r8, %r11
6:  and IPROBE_COND_FAST_MASK(%rcx), %r11
    xor IPROBE_COND_FAST_SIGNBIT(%rcx), %r11
    sub IPROBE_COND_FAST_SIGNBIT(%rcx), %r11
    xor IPROBE_COND_FAST_BIAS(%rcx), %r11
    sub IPROBE_COND_FAST_LOW(%rcx), %r11
    cmp IPROBE_COND_FAST_SPAN(%rcx), %r11
    setbe %dl
    xor IPROBE_COND_FAST_INVERT(%rcx), %dl
    jnz 9f                                          /* it holds: traced, in C */
    imul $FAST_STATS_SIZE, %rax, %rax            /* the offset of its calls */
    mov %rax, 32(%rsp)
    WHEN_RESTORE
    jmp iprobe_rt_count_enter_return_nop
9:  .cfi_restore_state
    WHEN_RESTORE
    jmp iprobe_rt_trace_enter_return_slow
    .cfi_endproc
    .size iprobe_rt_trace_enter_return_nop, . - iprobe_rt_trace_enter_return_nop

COUNT_ENTRY iprobe_rt_count_enter_return_nop, iprobe_rt_count_enter_return_slow, 1
COUNT_ENTRY iprobe_rt_count_return_nop, iprobe_rt_count_return_slow, 0

/* Slow paths and the trace handler's entry points (C, which touches no
 * vector register: the argument registers xmm0-7 need no saving). */
ENTRY_SITE_CALL iprobe_rt_count_enter_return_slow, iprobe_rt_count_enter_return_at, 0
ENTRY_SITE_CALL iprobe_rt_count_return_slow, iprobe_rt_count_return_at, 0
ENTRY_SITE_CALL iprobe_rt_count_counter_nop, iprobe_rt_count_counter_at, 0
ENTRY_SITE_CALL iprobe_rt_trace_enter_id_slow, iprobe_rt_trace_enter_id_at, 0
ENTRY_SITE_CALL iprobe_rt_trace_return_nop, iprobe_rt_trace_return_at, 0
ENTRY_SITE_CALL iprobe_rt_trace_enter_return_slow, iprobe_rt_trace_enter_return_at, 0

/* uint64_t iprobe_rt_vector_safe_call(uint64_t (*fn)(void*, void*), void* a, void* b):
 * fn(a, b) with xmm0-15 kept.  The runtime's C code uses no vector register
 * (-mgeneral-regs-only); libc, which its rare slow paths call (claiming a
 * ring or a thread slot), may, and at a function-entry site xmm0-7 are the
 * function's arguments. */
    .p2align 4
    .globl iprobe_rt_vector_safe_call
    .hidden iprobe_rt_vector_safe_call
    .type iprobe_rt_vector_safe_call, @function
iprobe_rt_vector_safe_call:
    .cfi_startproc
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_offset rbp, -16
    mov %rsp, %rbp
    .cfi_def_cfa_register rbp
    and $-16, %rsp
    sub $256, %rsp
    movdqa %xmm0, 0(%rsp)
    movdqa %xmm1, 16(%rsp)
    movdqa %xmm2, 32(%rsp)
    movdqa %xmm3, 48(%rsp)
    movdqa %xmm4, 64(%rsp)
    movdqa %xmm5, 80(%rsp)
    movdqa %xmm6, 96(%rsp)
    movdqa %xmm7, 112(%rsp)
    movdqa %xmm8, 128(%rsp)
    movdqa %xmm9, 144(%rsp)
    movdqa %xmm10, 160(%rsp)
    movdqa %xmm11, 176(%rsp)
    movdqa %xmm12, 192(%rsp)
    movdqa %xmm13, 208(%rsp)
    movdqa %xmm14, 224(%rsp)
    movdqa %xmm15, 240(%rsp)
    mov %rdi, %rax
    mov %rsi, %rdi
    mov %rdx, %rsi
    call *%rax
    movdqa 0(%rsp), %xmm0
    movdqa 16(%rsp), %xmm1
    movdqa 32(%rsp), %xmm2
    movdqa 48(%rsp), %xmm3
    movdqa 64(%rsp), %xmm4
    movdqa 80(%rsp), %xmm5
    movdqa 96(%rsp), %xmm6
    movdqa 112(%rsp), %xmm7
    movdqa 128(%rsp), %xmm8
    movdqa 144(%rsp), %xmm9
    movdqa 160(%rsp), %xmm10
    movdqa 176(%rsp), %xmm11
    movdqa 192(%rsp), %xmm12
    movdqa 208(%rsp), %xmm13
    movdqa 224(%rsp), %xmm14
    movdqa 240(%rsp), %xmm15
    mov %rbp, %rsp
    pop %rbp
    .cfi_def_cfa rsp, 8
    .cfi_restore rbp
    ret
    .cfi_endproc
    .size iprobe_rt_vector_safe_call, . - iprobe_rt_vector_safe_call

    .section .note.GNU-stack, "", @progbits
