/*
 * Register-preserving entry points for NOP-form sites: the compiler saved
 * nothing around the 5-byte NOP, so everything a C handler may clobber is
 * saved here.  The caller's stack alignment is unknown (points sit anywhere
 * in a function), so the frame is aligned explicitly.  Points also keep the
 * flags, and pass the saved rdi, rsi, rdx, rcx (IPROBE_POINT_ARGS) to C.
 */
    .text

.macro SAVE_CALL_RESTORE name, handler, with_flags, with_args
    .globl \name
    .type \name, @function
    .p2align 4
\name:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov %rsp, %rbp
    .cfi_def_cfa_register %rbp
.if \with_flags
    pushfq
.endif
    push %r11
    push %r10
    push %r9
    push %r8
    push %rax
    push %rcx
    push %rdx
    push %rsi
    push %rdi
    mov %rsp, %rsi           /* saved rdi, rsi, rdx, rcx in argument order */
    and $-16, %rsp
.if \with_flags
    /* mid-function points: every vector register may be live */
    sub $128, %rsp
    movdqa %xmm8, 0(%rsp)
    movdqa %xmm9, 16(%rsp)
    movdqa %xmm10, 32(%rsp)
    movdqa %xmm11, 48(%rsp)
    movdqa %xmm12, 64(%rsp)
    movdqa %xmm13, 80(%rsp)
    movdqa %xmm14, 96(%rsp)
    movdqa %xmm15, 112(%rsp)
.endif
    sub $128, %rsp
    movdqa %xmm0, 0(%rsp)
    movdqa %xmm1, 16(%rsp)
    movdqa %xmm2, 32(%rsp)
    movdqa %xmm3, 48(%rsp)
    movdqa %xmm4, 64(%rsp)
    movdqa %xmm5, 80(%rsp)
    movdqa %xmm6, 96(%rsp)
    movdqa %xmm7, 112(%rsp)
    mov 8(%rbp), %rdi        /* the site's return address identifies the probe */
    call \handler
    movdqa 0(%rsp), %xmm0
    movdqa 16(%rsp), %xmm1
    movdqa 32(%rsp), %xmm2
    movdqa 48(%rsp), %xmm3
    movdqa 64(%rsp), %xmm4
    movdqa 80(%rsp), %xmm5
    movdqa 96(%rsp), %xmm6
    movdqa 112(%rsp), %xmm7
.if \with_flags
    movdqa 128(%rsp), %xmm8
    movdqa 144(%rsp), %xmm9
    movdqa 160(%rsp), %xmm10
    movdqa 176(%rsp), %xmm11
    movdqa 192(%rsp), %xmm12
    movdqa 208(%rsp), %xmm13
    movdqa 224(%rsp), %xmm14
    movdqa 240(%rsp), %xmm15
.endif
.if \with_flags
    lea -80(%rbp), %rsp
.else
    lea -72(%rbp), %rsp
.endif
    pop %rdi
    pop %rsi
    pop %rdx
    pop %rcx
    pop %rax
    pop %r8
    pop %r9
    pop %r10
    pop %r11
.if \with_flags
    popfq
.endif
    pop %rbp
    .cfi_def_cfa %rsp, 8
    ret
    .cfi_endproc
    .size \name, . - \name
.endm

SAVE_CALL_RESTORE iprobe_rt_trace_enter_nop, iprobe_rt_trace_enter_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_exit_nop,  iprobe_rt_trace_exit_at,  0, 0
SAVE_CALL_RESTORE iprobe_rt_trace_point_nop, iprobe_rt_trace_point_at, 1, 1
SAVE_CALL_RESTORE iprobe_rt_count_enter_nop, iprobe_rt_count_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_exit_nop,  iprobe_rt_count_at, 0, 0
SAVE_CALL_RESTORE iprobe_rt_count_point_nop, iprobe_rt_count_at, 1, 0

    .section .note.GNU-stack, "", @progbits
