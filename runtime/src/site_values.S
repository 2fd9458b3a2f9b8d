/* The -finstrument-functions flow's entry point with values (site_values.c).
 * A site's own stub (hotpatch/src/stubs.h: mov $id, %edi; jmp) comes here
 * from the call that replaced __cyg_profile_func_enter's: every register
 * but rdi is as the function had it at that call, which is what the
 * parameters' DWARF locations at the site describe.  They are laid out by
 * DWARF register number (0-15 the integer registers, 7 the stack pointer
 * at the site, 17-32 the low 64 bits of xmm0-15) for the recipe to pick
 * from.  The site is a call: the function expects the caller-saved
 * registers clobbered, and the C below keeps the callee-saved ones. */
    .text

#define FRAME 264 /* 33 words; the return address makes rsp 16-aligned at the call */

    .globl iprobe_rt_trace_enter_id_regs
    .type iprobe_rt_trace_enter_id_regs, @function
    .p2align 4
iprobe_rt_trace_enter_id_regs:
    .cfi_startproc
    sub $FRAME, %rsp
    .cfi_adjust_cfa_offset FRAME
    mov %rax, 0(%rsp)
    mov %rdx, 8(%rsp)
    mov %rcx, 16(%rsp)
    mov %rbx, 24(%rsp)
    mov %rsi, 32(%rsp)
    movq $0, 40(%rsp)              /* rdi: the stub's */
    mov %rbp, 48(%rsp)
    lea FRAME+8(%rsp), %rax        /* rsp at the site, before its call */
    mov %rax, 56(%rsp)
    mov %r8, 64(%rsp)
    mov %r9, 72(%rsp)
    mov %r10, 80(%rsp)
    mov %r11, 88(%rsp)
    mov %r12, 96(%rsp)
    mov %r13, 104(%rsp)
    mov %r14, 112(%rsp)
    mov %r15, 120(%rsp)
    movq $0, 128(%rsp)             /* 16: the return address column, not a register */
    movq %xmm0, 136(%rsp)
    movq %xmm1, 144(%rsp)
    movq %xmm2, 152(%rsp)
    movq %xmm3, 160(%rsp)
    movq %xmm4, 168(%rsp)
    movq %xmm5, 176(%rsp)
    movq %xmm6, 184(%rsp)
    movq %xmm7, 192(%rsp)
    movq %xmm8, 200(%rsp)
    movq %xmm9, 208(%rsp)
    movq %xmm10, 216(%rsp)
    movq %xmm11, 224(%rsp)
    movq %xmm12, 232(%rsp)
    movq %xmm13, 240(%rsp)
    movq %xmm14, 248(%rsp)
    movq %xmm15, 256(%rsp)
    mov %rsp, %rsi                 /* edi: the probe, from the stub */
    call iprobe_rt_site_values_enter
    add $FRAME, %rsp
    .cfi_adjust_cfa_offset -FRAME
    ret
    .cfi_endproc
    .size iprobe_rt_trace_enter_id_regs, .-iprobe_rt_trace_enter_id_regs

/* The exit hooks of a function whose entry hooks its return
 * (rt_layout.h, iprobe_rt_exit_recipe): rt.c (iprobe_rt_site_exit_at) records the exit
 * unless this call's return slot holds the function's trampoline, which
 * records it; the trace handler's, and the count handler's (`completed`).
 * The stub hands the probe in edi; rsp and rbp as at the site go along for
 * the recipe.  The site is a call: the function expects the caller-saved
 * registers clobbered. */
    .globl iprobe_rt_site_exit_checked_count
    .type iprobe_rt_site_exit_checked_count, @function
    .globl iprobe_rt_site_exit_checked
    .type iprobe_rt_site_exit_checked, @function
    .p2align 4
iprobe_rt_site_exit_checked_count:
    .cfi_startproc
    mov $1, %ecx
    jmp 1f
iprobe_rt_site_exit_checked:
    xor %ecx, %ecx
1:  lea 8(%rsp), %rsi              /* rsp at the site, before its call */
    mov %rbp, %rdx
    sub $8, %rsp                   /* 16-aligned at the call */
    .cfi_adjust_cfa_offset 8
    call iprobe_rt_site_exit_at
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size iprobe_rt_site_exit_checked, .-iprobe_rt_site_exit_checked
    .size iprobe_rt_site_exit_checked_count, .-iprobe_rt_site_exit_checked_count

    .section .note.GNU-stack, "", @progbits
