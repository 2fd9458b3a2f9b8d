/*
 * The trace handler's fast path (trace_fast.h says what it serves and why
 * it nests with signal handlers as the C path does).  Registers: as
 * everywhere at a function-entry site and a hooked return
 * (return_trampolines.S), nothing changes that the function would not
 * change; these use no vector register.
 */
#include "return_stack.h"
#include "trace_fast.h"
#include "iprobe/runtime/save_call_restore.inc"

    .text

/* RING_FULL: iprobe_rt_trace_ring_full(%rdx, %r8) with the stack aligned,
 * rdx (the index), rsi (the probe), r8 (the time), r9 (t_producer's
 * offset), r10 (its depth) and r11 kept; rax its answer: 0 when the event
 * was dropped, else 1 + the index to write it at (after a GAP record when
 * events were dropped before it: rt.c).  Every other caller-saved register
 * is one the caller keeps on its stack already. */
.macro RING_FULL
    push %rbp
    .cfi_adjust_cfa_offset 8
    .cfi_rel_offset rbp, 0
    mov %rsp, %rbp
    .cfi_def_cfa_register rbp
    and $-16, %rsp
    push %rdx
    push %rsi
    push %r8
    push %r9
    push %r10
    push %r11                                    /* six: the stack stays aligned */
    mov %rdx, %rdi
    mov %r8, %rsi
    call iprobe_rt_trace_ring_full
    pop %r11
    pop %r10
    pop %r9
    pop %r8
    pop %rsi
    pop %rdx
    mov %rbp, %rsp
    .cfi_def_cfa_register rsp
    pop %rbp
    .cfi_adjust_cfa_offset -8
    .cfi_restore rbp
.endm

/* APPEND_RECORD kind, probe_reg32, full, prefetch: raises the producer's
 * depth and writes the record at the place xadd reserved for it in this
 * thread's ring, as ring_append writes it (rt.c), then lowers the depth and
 * publishes when it is the outermost: r8 = the time, r9 = t_producer's TLS
 * offset; clobbers rax, rcx, rdx, r10, the probe register and, with
 * prefetch, rdi.  Jumps to `full` (which comes back to 1: or 2:) when the
 * ring looked full.
 * The depth is loaded once (r10) and stored raised, then stored back, not
 * added to and reloaded in memory: a read-modify-write chain on one word
 * twice an event was measured to cost ~0.3 ns an event (bench/RESULTS.md,
 * "a leaner fast path").  A signal handler that lands between the load and
 * the store raises and lowers the depth again before this goes on, so it
 * nests as with ring_append's t->depth++. */
.macro APPEND_RECORD kind, probe, full, prefetch
    mov %fs:PRODUCER_DEPTH(%r9), %r10d
    lea 1(%r10), %eax
    mov %eax, %fs:PRODUCER_DEPTH(%r9)
    mov $1, %edx
    /* one instruction: a signal handler probing in this thread sees the
     * reservation whole or not at all */
    xadd %rdx, %fs:PRODUCER_RESERVE(%r9)
    mov %rdx, %rax
    sub %fs:PRODUCER_TAIL_SEEN(%r9), %rax
    cmp %fs:PRODUCER_MASK(%r9), %rax
    ja \full
1:  mov %fs:PRODUCER_MASK(%r9), %rax
    mov %fs:PRODUCER_RECORDS(%r9), %rcx
.if \prefetch
    lea FAST_RING_PREFETCH(%rdx), %rdi
    and %rax, %rdi
    shl $FAST_RECORD_SHIFT, %rdi
    prefetchw (%rcx,%rdi)
.endif
    and %rax, %rdx
    shl $FAST_RECORD_SHIFT, %rdx
    add %rcx, %rdx
    mov %r8, FAST_RECORD_TSC(%rdx)
    mov %fs:PRODUCER_TID(%r9), %eax
    shl $(FAST_RECORD_TID - FAST_RECORD_PROBE) * 8, %rax
    or %rax, \probe
    mov \probe, FAST_RECORD_PROBE(%rdx)         /* probe, tid */
    movzwl %r10w, %eax                           /* the depth before the raise */
    shl $(FAST_RECORD_DEPTH - FAST_RECORD_KIND) * 8, %eax
    or $\kind, %eax
    mov %rax, FAST_RECORD_KIND(%rdx)             /* kind, nargs 0, depth, values 0 */
    movq $0, FAST_RECORD_FRAME(%rdx)
2:  /* only the outermost handler publishes (ring_append) */
    mov %r10d, %fs:PRODUCER_DEPTH(%r9)
    test %r10d, %r10d
    jnz 4f
    mov %fs:PRODUCER_RING(%r9), %rcx
3:  mov %fs:PRODUCER_RESERVE(%r9), %rax
    mov %rax, FAST_RING_HEAD(%rcx)
    cmp %fs:PRODUCER_RESERVE(%r9), %rax
    jne 3b
4:
.endm

/* ENTRY_RESTORE: the registers the entry saved (its own and
 * iprobe_rt_trace_enter_return_nop's), back. */
.macro ENTRY_RESTORE
    pop %r10
    .cfi_adjust_cfa_offset -8
    pop %r9
    .cfi_adjust_cfa_offset -8
    pop %r8
    .cfi_adjust_cfa_offset -8
    pop %rdi
    .cfi_adjust_cfa_offset -8
    pop %rsi
    .cfi_adjust_cfa_offset -8
    WHEN_RESTORE
.endm

/* EXIT_RESTORE: the registers the exit saved, back (the common tail's it leaves alone). */
.macro EXIT_RESTORE
    pop %r10
    .cfi_adjust_cfa_offset -8
    pop %r9
    .cfi_adjust_cfa_offset -8
    pop %rdx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
.endm

/* PROBE_OF id32, id64, probe, fail: `probe` = the probe table's entry of
 * the probe id in `id32` (zero-extended in `id64`), or to `fail` when the
 * id is not below the table's capacity (0 until a region is mapped). */
.macro PROBE_OF id32, id64, probe, fail
    cmp iprobe_rt_when_probe_capacity(%rip), \id32
    jae \fail
    mov \id64, \probe
    shl $FAST_PROBE_SHIFT, \probe
    add iprobe_rt_when_probes(%rip), \probe
.endm

/* ENTRY_ONLY_SAVE / ENTRY_ONLY_RESTORE: the registers the entry-only path
 * uses, kept for the function. */
.macro ENTRY_ONLY_SAVE
    .irp reg, rax, rcx, rdx, rsi, rdi, r8, r9, r10
    push %\reg
    .cfi_adjust_cfa_offset 8
    .endr
.endm
.macro ENTRY_ONLY_RESTORE
    .irp reg, r10, r9, r8, rdi, rsi, rdx, rcx, rax
    pop %\reg
    .cfi_adjust_cfa_offset -8
    .endr
.endm

/* ---- the entry ----
 * From iprobe_rt_trace_enter_return_nop (return_trampolines.S) for a
 * function without a --when: rax = its entry probe (in the probe table,
 * the id below its capacity), [rsp] r11, [8] rdx, [16] rcx, [24] rax,
 * [32] id, [40] the site's end, [48] the return slot. */
    .p2align 4
    .globl iprobe_rt_trace_enter_fast
    .hidden iprobe_rt_trace_enter_fast
    .type iprobe_rt_trace_enter_fast, @function
iprobe_rt_trace_enter_fast:
    .cfi_startproc
    .cfi_def_cfa rsp, 56
    .cfi_offset rip, -8
    push %rsi
    .cfi_adjust_cfa_offset 8
    push %rdi
    .cfi_adjust_cfa_offset 8
    push %r8
    .cfi_adjust_cfa_offset 8
    push %r9
    .cfi_adjust_cfa_offset 8
    push %r10
    .cfi_adjust_cfa_offset 8
    .cfi_remember_state
    /* [0] r10 [8] r9 [16] r8 [24] rdi [32] rsi [40] r11 [48] rdx [56] rcx [64] rax
     * [72] id [80] the site's end [88] the return slot */
    cmpl $0, iprobe_rt_trace_fast_clock(%rip)
    je 7f
    mov 72(%rsp), %rdi
    add $1, %rdi                                 /* its exit probe */
    mov iprobe_rt_when_probe_capacity(%rip), %ecx
    cmp %rcx, %rdi
    jae 7f
    cmpq $0, FAST_PROBE_VALUES(%rax)
    jne 7f
    movzbl FAST_PROBE_TIMED(%rax), %esi
    test %esi, %esi
    je 7f
    and $FAST_COOKIE_TIMED, %esi                 /* IPROBE_RT_TIMED: 1; EXIT_UNSTAMPED: 0, no frame */
    mov FAST_PROBE_STAT(%rax), %r10d
    cmp iprobe_rt_when_stat_capacity(%rip), %r10d
    jae 7f
    mov iprobe_rt_thread@gottpoff(%rip), %rcx
    cmpq $0, %fs:RET_THREAD_STATS(%rcx)
    je 7f
    mov iprobe_rt_producer@gottpoff(%rip), %r9
    mov %fs:PRODUCER_SLOT(%r9), %rax
    test %rax, %rax
    je 7f
    /* at the frames' cap C drops what a longjmp abandoned (drop_abandoned) */
    cmpl $FAST_STACK_DEPTH - 1, FAST_THREAD_DEPTH(%rax)
    jae 7f
    cmpq $0, %fs:PRODUCER_RING(%r9)
    je 7f
    /* a return entry, as the count handler takes one */
    mov %fs:RET_THREAD_NEXT(%rcx), %r11
    cmp %fs:RET_THREAD_LIMIT(%rcx), %r11
    jae 7f
    /* one instruction: a signal handler hooking in this thread nests above */
    addq $IPROBE_RT_RETURN_ENTRY_SIZE, %fs:RET_THREAD_NEXT(%rcx)
    mov 88(%rsp), %rax
    mov %rax, RET_ENTRY_RET(%r11)
    lea 88(%rsp), %rax
    mov %rax, RET_ENTRY_SLOT(%r11)
    shl $32, %rdi
    or $IPROBE_RT_RETURN_TRACE, %rdi
    mov %rdi, RET_ENTRY_HANDLER(%r11)            /* handler, arg = the exit probe */
    mov %rsi, RET_ENTRY_COOKIE(%r11)             /* timed, or its exit unstamped */
    /* the clock, then the sums (enter_timed) */
    mov %fs:RET_THREAD_STATS(%rcx), %rsi
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8                                /* now */
    imul $FAST_STATS_SIZE, %r10, %rax
    addq $1, FAST_STATS_CALLS(%rsi,%rax)
    cmpq $0, RET_ENTRY_COOKIE(%r11)
    je 1f                                        /* --no-durations: no frame to time it by */
    mov %fs:PRODUCER_SLOT(%r9), %rcx
    mov $1, %eax
    /* one instruction: a signal handler's frames nest above this one */
    xadd %eax, FAST_THREAD_DEPTH(%rcx)
    cmp $FAST_STACK_DEPTH, %eax
    jae 1f
    imul $FAST_FRAME_SIZE, %rax, %rax
    lea FAST_THREAD_STACK(%rcx,%rax), %rax
    mov %r10d, FAST_FRAME_STAT(%rax)
    mov RET_ENTRY_SLOT(%r11), %edx
    mov %edx, FAST_FRAME_TAG(%rax)               /* found again by its slot at the exit */
    mov %r8, FAST_FRAME_START(%rax)
    movq $0, FAST_FRAME_CHILDREN(%rax)
1:  /* the record */
    mov 72(%rsp), %esi
    APPEND_RECORD FAST_REC_ENTRY, %rsi, 8f, 0
    /* go on through the entry's unit: sled + (entry - pool) */
    RETURN_UNIT_OF %r11, %rax
    mov %r11, 72(%rsp)
    ENTRY_RESTORE
    ENTRY_SITE_GO_ON
8:  .cfi_restore_state
    .cfi_remember_state
    RING_FULL
    test %rax, %rax
    jz 2b                                        /* dropped, counted */
    lea -1(%rax), %rdx                           /* it fits: write it there */
    jmp 1b
7:  .cfi_restore_state
    /* not the common case: C decides it all (nothing changed yet) */
    ENTRY_RESTORE
    jmp iprobe_rt_trace_enter_return_slow
    .cfi_endproc
    .size iprobe_rt_trace_enter_fast, . - iprobe_rt_trace_enter_fast

/* ---- the exit ----
 * From iprobe_rt_return_common (return_trampolines.S) for an entry that is
 * not the count handler's: rdi = the entry, r11 = its unit, [rsp] r8,
 * [8] rcx, [16] rsi, [24] rdi, [32] the caller's r11.  Goes back to
 * iprobe_rt_return_recorded with rdi = the entry, or, for anything but the
 * common case and before changing anything, to iprobe_rt_return_record_in_c
 * with r11 = the unit.  CFI as in the common tail. */
    .p2align 4
    .globl iprobe_rt_trace_exit_fast
    .hidden iprobe_rt_trace_exit_fast
    .type iprobe_rt_trace_exit_fast, @function
iprobe_rt_trace_exit_fast:
    .cfi_startproc
    .cfi_def_cfa rsp, 48
    .cfi_val_offset rsp, -8
    .cfi_escape 0x16, 0x10, 6, 0x7b, IPROBE_RT_RETURN_UNIT_ENTRY, 0x12, 0x06, 0x22, 0x06
    cmpl $IPROBE_RT_RETURN_TRACE, RET_ENTRY_HANDLER(%rdi)
    jne iprobe_rt_return_record_in_c
    cmpq $FAST_COOKIE_TIMED, RET_ENTRY_COOKIE(%rdi)
    ja iprobe_rt_return_record_in_c              /* timed (1), or no frame (0: below) */
    cmpl $0, iprobe_rt_trace_fast_clock(%rip)
    je iprobe_rt_return_record_in_c
    push %rax
    .cfi_adjust_cfa_offset 8
    push %rdx
    .cfi_adjust_cfa_offset 8
    push %r9
    .cfi_adjust_cfa_offset 8
    push %r10
    .cfi_adjust_cfa_offset 8
    .cfi_remember_state
    /* [0] r10 [8] r9 [16] rdx [24] rax (the return registers) [32] r8 [40] rcx [48] rsi [56] rdi */
    mov RET_ENTRY_ARG(%rdi), %esi                /* the exit probe */
    PROBE_OF %esi, %rsi, %rax, 7f
    cmpq $0, FAST_PROBE_VALUES(%rax)
    jne 7f
    cmpb $0, FAST_PROBE_RETVAL_HIST(%rax)
    jne 7f
    mov FAST_PROBE_STAT(%rax), %r8d
    cmp iprobe_rt_when_stat_capacity(%rip), %r8d
    jae 7f
    mov iprobe_rt_thread@gottpoff(%rip), %rcx
    mov %fs:RET_THREAD_STATS(%rcx), %r10
    test %r10, %r10
    je 7f
    mov iprobe_rt_producer@gottpoff(%rip), %r9
    mov %fs:PRODUCER_SLOT(%r9), %rcx
    test %rcx, %rcx
    je 7f
    cmpq $0, %fs:PRODUCER_RING(%r9)
    je 7f
    cmpq $0, RET_ENTRY_COOKIE(%rdi)
    je .Lexit_unstamped
    /* the frame on top is this function's (exit_timed's common case:
     * nothing skipped by longjmp, not deeper than the frames kept) */
    mov FAST_THREAD_DEPTH(%rcx), %esi
    sub $1, %esi                                 /* top - 1 */
    cmp $FAST_STACK_DEPTH, %esi
    jae 7f
    mov RET_ENTRY_SLOT(%rdi), %eax               /* its slot: the frame's tag */
    imul $FAST_FRAME_SIZE, %rsi, %rdi
    lea FAST_THREAD_STACK(%rcx,%rdi), %rdi       /* its frame */
    cmp %r8d, FAST_FRAME_STAT(%rdi)
    jne 7f
    cmp %eax, FAST_FRAME_TAG(%rdi)
    jne 7f
    /* the clock, then the sums (exit_timed) */
    imul $FAST_STATS_SIZE, %r8, %r8
    add %r8, %r10                                /* the function's sums */
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8                                /* now */
    addq $1, FAST_STATS_COMPLETED(%r10)
    sub FAST_FRAME_START(%rdi), %rax             /* ticks = now - start, 0 if before */
    jae 1f
    xor %eax, %eax
1:  mov %rax, %rdx
    sub FAST_FRAME_CHILDREN(%rdi), %rdx          /* self = ticks - children, 0 if below */
    jae 2f
    xor %edx, %edx
2:  test %esi, %esi
    je 3f
    add %rax, FAST_FRAME_CHILDREN - FAST_FRAME_SIZE(%rdi) /* the caller's frame */
3:  mov %esi, FAST_THREAD_DEPTH(%rcx)
    addq $1, FAST_STATS_TIMED(%r10)
    add %rax, FAST_STATS_INCLUSIVE(%r10)
    add %rdx, FAST_STATS_EXCLUSIVE(%r10)
    mov %rax, %rdx
    or $1, %rdx
    bsr %rdx, %rdx                               /* floor(log2(ticks)), 0 for 0 */
    mov $FAST_HIST_BUCKETS - 1, %ecx
    cmp %ecx, %edx
    cmova %ecx, %edx
    addq $1, FAST_STATS_HISTOGRAM(%r10,%rdx,8)
    cmp FAST_STATS_MAX(%r10), %rax
    jbe 4f
    mov %rax, FAST_STATS_MAX(%r10)
4:
.Lexit_record:  /* the record: its probe again from the entry */
    mov IPROBE_RT_RETURN_UNIT_ENTRY(%r11), %rsi
    mov IPROBE_RT_RETURN_UNIT_ENTRY + RET_ENTRY_ARG(%r11,%rsi), %esi
    APPEND_RECORD FAST_REC_EXIT, %rsi, 8f, 1
    EXIT_RESTORE
    mov IPROBE_RT_RETURN_UNIT_ENTRY(%r11), %rdi
    lea IPROBE_RT_RETURN_UNIT_ENTRY(%r11,%rdi), %rdi
    jmp iprobe_rt_return_recorded
8:  .cfi_restore_state
    .cfi_remember_state
    RING_FULL
    test %rax, %rax
    jz 2b
    lea -1(%rax), %rdx
    jmp 1b
.Lexit_unstamped:
    /* an exit recorded without its time (attach --no-durations; rt.c,
     * emit_probe): completed, no frame, no clock read; else C decides */
    cmpb $FAST_EXIT_UNSTAMPED, FAST_PROBE_TIMED(%rax)
    jne 7f
    imul $FAST_STATS_SIZE, %r8, %r8
    addq $1, FAST_STATS_COMPLETED(%r10,%r8)
    mov $FAST_NO_TIME, %r8                       /* sign-extended: all ones */
    jmp .Lexit_record
7:  .cfi_restore_state
    EXIT_RESTORE
    mov IPROBE_RT_RETURN_UNIT_ENTRY(%r11), %rdi  /* the entry again (rdi may hold a frame) */
    lea IPROBE_RT_RETURN_UNIT_ENTRY(%r11,%rdi), %rdi
    jmp iprobe_rt_return_record_in_c
    .cfi_endproc
    .size iprobe_rt_trace_exit_fast, . - iprobe_rt_trace_exit_fast

/* ---- an entry whose exit is off (attach --entry-only) ----
 * One clock read a call: the call counted and its entry's record appended,
 * nothing hooked at its return (the C path, iprobe_rt_trace_enter_id_at,
 * does the same for this case).  From the site's stub: [rsp] the entry
 * probe's id, [8] the site's end, [16] the return slot.  A probe with
 * values, a --when or a timed frame (its exit probe on after all), a thread
 * whose sums or ring are not claimed yet, or a clock other than the TSC go
 * to C before anything changed. */
    .p2align 4
    .globl iprobe_rt_trace_enter_id_nop
    .type iprobe_rt_trace_enter_id_nop, @function
iprobe_rt_trace_enter_id_nop:
    .cfi_startproc
    .cfi_def_cfa rsp, 24
    .cfi_offset rip, -8
    ENTRY_ONLY_SAVE
    .cfi_remember_state
    /* [0] r10 [8] r9 [16] r8 [24] rdi [32] rsi [40] rdx [48] rcx [56] rax
     * [64] id [72] the site's end [80] the return slot */
    cmpl $0, iprobe_rt_trace_fast_clock(%rip)
    je 7f
    mov 64(%rsp), %esi
    PROBE_OF %esi, %rsi, %rax, 7f
    cmpq $0, FAST_PROBE_VALUES(%rax)
    jne 7f
    testl $FAST_PROBE_TIMED_OR_CONDITION, FAST_PROBE_TIMED(%rax)
    jne 7f
    mov FAST_PROBE_STAT(%rax), %r10d
    cmp iprobe_rt_when_stat_capacity(%rip), %r10d
    jae 7f
    mov iprobe_rt_thread@gottpoff(%rip), %rcx
    mov %fs:RET_THREAD_STATS(%rcx), %rcx
    test %rcx, %rcx
    je 7f
    mov iprobe_rt_producer@gottpoff(%rip), %r9
    cmpq $0, %fs:PRODUCER_RING(%r9)
    je 7f
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8                                /* now */
    imul $FAST_STATS_SIZE, %r10, %rax
    addq $1, FAST_STATS_CALLS(%rcx,%rax)
    /* a point at the entry probe: no exit of this function is on
     * (rt_layout.h, IPROBE_RT_REC_POINT; ring_append does the same) */
    APPEND_RECORD FAST_REC_POINT, %rsi, 8f, 1
    ENTRY_ONLY_RESTORE
    /* on at the site's end, no return hooked (what the jump reads stays in
     * the red zone for one instruction, as ENTRY_SITE_GO_ON's) */
    lea 16(%rsp), %rsp
    .cfi_adjust_cfa_offset -16
    jmp *-8(%rsp)
8:  .cfi_restore_state
    .cfi_remember_state
    RING_FULL
    test %rax, %rax
    jz 2b                                        /* dropped, counted */
    lea -1(%rax), %rdx                           /* it fits: write it there */
    jmp 1b
7:  .cfi_restore_state
    ENTRY_ONLY_RESTORE
    jmp iprobe_rt_trace_enter_id_slow
    .cfi_endproc
    .size iprobe_rt_trace_enter_id_nop, . - iprobe_rt_trace_enter_id_nop

    .section .note.GNU-stack, "", @progbits
