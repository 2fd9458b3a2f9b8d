/*
 * What an enabled probe may change, seen from a caller that trusts its
 * callee's actual clobbers, as gcc's interprocedural register allocation
 * does: rg_leaf is padded the way the entry flow pads a function (five
 * 1-byte NOPs, its symbol's first bytes) and changes nothing but rax;
 * rg_check keeps a known value in every other general register (rsp aside)
 * and in xmm0-15 across each call, and counts the calls after which one had
 * changed.
 */
    .text

    .globl rg_leaf
    .type rg_leaf, @function
    .p2align 4
rg_leaf:
    .cfi_startproc
    nop
    nop
    nop
    nop
    nop
    mov $7, %eax
    ret
    .cfi_endproc
    .size rg_leaf, . - rg_leaf

#define G_RCX 0x1111111111111101
#define G_RDX 0x2222222222222202
#define G_RSI 0x3333333333333303
#define G_RDI 0x4444444444444404
#define G_R8  0x5555555555555505
#define G_R9  0x6666666666666606
#define G_R10 0x7777777777777707
#define G_R11 0x0888888888888808
#define G_RBP 0x0999999999999909
#define G_R15 0x0aaaaaaaaaaaaa0a
#define X_BASE 0x0123456789abcd00

.macro SET_X n
    movabs $(X_BASE + \n), %rax
    movq %rax, %xmm\n
.endm
.macro CHECK_G reg, value
    movabs $\value, %rax
    xor \reg, %rax
    or %rax, %rbx
.endm
.macro CHECK_X n
    movq %xmm\n, %rax
    movabs $(X_BASE + \n), %r14
    xor %r14, %rax
    or %rax, %rbx
.endm

/* long rg_check(long calls): the calls after which a register had changed */
    .globl rg_check
    .type rg_check, @function
    .p2align 4
rg_check:
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    push %rbp
    .cfi_adjust_cfa_offset 8
    push %r12
    .cfi_adjust_cfa_offset 8
    push %r13
    .cfi_adjust_cfa_offset 8
    push %r14
    .cfi_adjust_cfa_offset 8
    push %r15
    .cfi_adjust_cfa_offset 8
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    mov %rdi, %r12
    xor %r13d, %r13d
1:
    SET_X 0
    SET_X 1
    SET_X 2
    SET_X 3
    SET_X 4
    SET_X 5
    SET_X 6
    SET_X 7
    SET_X 8
    SET_X 9
    SET_X 10
    SET_X 11
    SET_X 12
    SET_X 13
    SET_X 14
    SET_X 15
    movabs $G_RCX, %rcx
    movabs $G_RDX, %rdx
    movabs $G_RSI, %rsi
    movabs $G_RDI, %rdi
    movabs $G_R8, %r8
    movabs $G_R9, %r9
    movabs $G_R10, %r10
    movabs $G_R11, %r11
    movabs $G_RBP, %rbp
    movabs $G_R15, %r15
    call rg_leaf
    xor %ebx, %ebx
    CHECK_G %rcx, G_RCX
    CHECK_G %rdx, G_RDX
    CHECK_G %rsi, G_RSI
    CHECK_G %rdi, G_RDI
    CHECK_G %r8, G_R8
    CHECK_G %r9, G_R9
    CHECK_G %r10, G_R10
    CHECK_G %r11, G_R11
    CHECK_G %rbp, G_RBP
    CHECK_G %r15, G_R15
    CHECK_X 0
    CHECK_X 1
    CHECK_X 2
    CHECK_X 3
    CHECK_X 4
    CHECK_X 5
    CHECK_X 6
    CHECK_X 7
    CHECK_X 8
    CHECK_X 9
    CHECK_X 10
    CHECK_X 11
    CHECK_X 12
    CHECK_X 13
    CHECK_X 14
    CHECK_X 15
    test %rbx, %rbx
    setnz %al
    movzbl %al, %eax
    add %rax, %r13
    dec %r12
    jnz 1b
    mov %r13, %rax
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    pop %r15
    .cfi_adjust_cfa_offset -8
    pop %r14
    .cfi_adjust_cfa_offset -8
    pop %r13
    .cfi_adjust_cfa_offset -8
    pop %r12
    .cfi_adjust_cfa_offset -8
    pop %rbp
    .cfi_adjust_cfa_offset -8
    pop %rbx
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size rg_check, . - rg_check

    .section .note.GNU-stack, "", @progbits
