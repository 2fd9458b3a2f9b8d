/* Function entries of the relocation cases, written out so the first bytes
 * are exactly what each case needs (compiled with plain gcc, no iprobe-cc).
 * Each is called by reloc_cases.c, which checks its result. */
    .text

/* int rip_load(int x): a RIP-relative load is the first instruction */
    .globl rip_load
    .type rip_load, @function
    .p2align 4
rip_load:
    mov rip_base(%rip), %eax
    add %edi, %eax
    ret
    .size rip_load, . - rip_load

/* int rip_lea(int x): a RIP-relative lea (an address) first: *(&rip_base + 1) + x */
    .globl rip_lea
    .type rip_lea, @function
    .p2align 4
rip_lea:
    lea rip_base(%rip), %rax
    mov 4(%rax), %eax
    add %edi, %eax
    ret
    .size rip_lea, . - rip_lea

/* int short_branch(int x): a short conditional branch inside the first 5 bytes:
 * x == 0 ? -1 : x + 1 */
    .globl short_branch
    .type short_branch, @function
    .p2align 4
short_branch:
    test %edi, %edi
    je 1f
    lea 1(%rdi), %eax
    ret
1:  mov $-1, %eax
    ret
    .size short_branch, . - short_branch

/* int loop_to_entry(int n): its loop jumps back to its first instruction:
 * refused.  2 * max(n, 1) */
    .globl loop_to_entry
    .type loop_to_entry, @function
    .p2align 4
loop_to_entry:
    add $2, %eax
    sub $1, %edi
    jg loop_to_entry
    ret
    .size loop_to_entry, . - loop_to_entry

/* int tiny(void): 3 bytes: refused */
    .globl tiny
    .type tiny, @function
    .p2align 4
tiny:
    xor %eax, %eax
    ret
    .size tiny, . - tiny

/* int endbr_rip(int x): endbr64, then a RIP-relative load: the jump goes after endbr64 */
    .globl endbr_rip
    .type endbr_rip, @function
    .p2align 4
endbr_rip:
    endbr64
    mov rip_base+4(%rip), %eax
    sub %edi, %eax
    ret
    .size endbr_rip, . - endbr_rip

/* int call_first(int x): a relative call is the first instruction: twice(x) + 1 */
    .globl call_first
    .type call_first, @function
    .p2align 4
call_first:
    call twice
    add $1, %eax
    ret
    .size call_first, . - call_first

/* int call_unwound(int x) and call_unwound_indirect(int x): a call, direct
 * or through a pointer, ends the first 5 bytes; returned_from(x) (C) is
 * x + 7 when unwinding from it finds its caller's caller.  With CFI, as a
 * compiler leaves it. */
    .globl call_unwound
    .type call_unwound, @function
    .p2align 4
call_unwound:
    .cfi_startproc
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    call returned_from
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size call_unwound, . - call_unwound

    .globl call_unwound_indirect
    .type call_unwound_indirect, @function
    .p2align 4
call_unwound_indirect:
    .cfi_startproc
    sub $8, %rsp
    .cfi_adjust_cfa_offset 8
    call *returned_from_pointer(%rip)
    add $8, %rsp
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size call_unwound_indirect, . - call_unwound_indirect

/* int jump_first(int x): a short jump first, to code further on: x + 3 */
    .globl jump_first
    .type jump_first, @function
    .p2align 4
jump_first:
    jmp 1f
    .fill 6, 1, 0xcc
1:  lea 3(%rdi), %eax
    ret
    .size jump_first, . - jump_first

/* int jrcxz_first(int x): jrcxz (rel8 only) in the first bytes: refused
 * as an instruction that cannot move.  x == 0 ? 0 : x + 1 */
    .globl jrcxz_first
    .type jrcxz_first, @function
    .p2align 4
jrcxz_first:
    mov %edi, %ecx
    jrcxz 1f
    lea 1(%rdi), %eax
    ret
1:  xor %eax, %eax
    ret
    .size jrcxz_first, . - jrcxz_first

/* long keeps_registers(long x): keeps values in every call-clobbered
 * register but r11 across a call of leaf_add, which touches only rax, as
 * gcc's IPA-RA lets a caller do: a hooked exit of leaf_add must keep them.
 * Returns 8x + 28: (x + 7) + (x + 1) - 7, plus x + 2 ... x + 7 (rcx, rdx,
 * rsi, r8, r9, r10, rdi hold x + 1 ... x + 7 across the call). */
    .globl keeps_registers
    .type keeps_registers, @function
    .p2align 4
keeps_registers:
    lea 1(%rdi), %rcx
    lea 2(%rdi), %rdx
    lea 3(%rdi), %rsi
    lea 4(%rdi), %r8
    lea 5(%rdi), %r9
    lea 6(%rdi), %r10
    lea 7(%rdi), %rdi
    call leaf_add
    lea -7(%rdi,%rcx), %rax
    add %rdx, %rax
    add %rsi, %rax
    add %r8, %rax
    add %r9, %rax
    add %r10, %rax
    add %rdi, %rax
    ret
    .size keeps_registers, . - keeps_registers

/* long leaf_add(long x): x + 0 in rax, touching nothing else */
    .globl leaf_add
    .type leaf_add, @function
    .p2align 4
leaf_add:
    mov %rdi, %rax
    add $0, %rax
    ret
    .size leaf_add, . - leaf_add

/* long keeps_r11(long x): keeps x + 1 in r11 across a call of r11_leaf,
 * which leaves r11 alone, as gcc's IPA-RA lets a caller do: r11_leaf is
 * probe-able, and its probe (stubs, handler, trampoline, return
 * trampoline) must keep r11.  Returns 2x + 1. */
    .globl keeps_r11
    .type keeps_r11, @function
    .p2align 4
keeps_r11:
    lea 1(%rdi), %r11
    call r11_leaf
    add %r11, %rax
    ret
    .size keeps_r11, . - keeps_r11

/* long r11_leaf(long x): x, touching nothing but rax */
    .globl r11_leaf
    .type r11_leaf, @function
    .p2align 4
r11_leaf:
    mov %rdi, %rax
    add $0, %rax
    ret
    .size r11_leaf, . - r11_leaf

    .globl twice
    .type twice, @function
    .p2align 4
twice:
    lea (%rdi,%rdi), %eax
    ret
    .size twice, . - twice

    .data
    .globl rip_base
    .p2align 2
rip_base:
    .long 1000, 2000

    .section .note.GNU-stack,"",@progbits
