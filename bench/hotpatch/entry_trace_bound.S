/*
 * The bound of an entry-only trace event (issue 32, `attach --handler trace
 * --entry-only`), measured outside the runtime: what the same record would
 * cost if the site's own stub wrote it, against today's path into the
 * runtime (trace_fast.S's iprobe_rt_trace_enter_id_nop), instruction for
 * instruction apart from what each variant changes.  Functions f_* are
 * entry sites: `jmp stub` in place of the 5-byte NOP, `ret` at the site's
 * end.  The record is written as APPEND_RECORD writes it (trace_fast.S;
 * thread_producer's offsets of runtime/src/trace_fast.h, 32-byte records):
 * depth raised, one xadd, the full check, four stores, depth back, the
 * outermost publishes.  entry_trace_bound.c says what each variant is.
 */
#define RING 0
#define RECORDS 8
#define MASK 16
#define RESERVE 24
#define TAIL 32
#define TID 40
#define DEPTH 44
#define HEAD 16
#define ID 5
    .text
.macro SITE name, stub
    .globl \name
    .p2align 4
\name:
    jmp \stub
\name\()_end:
    ret
.endm

/* ---- plain: no probe ---- */
    .globl f_plain
    .p2align 4
f_plain:
    .byte 0x0f, 0x1f, 0x44, 0x00, 0x00
    ret

/* ---- count: as entry_count_stub_bytes ---- */
SITE f_count, s_count
s_count:
    push %r11
    mov %fs:stats@tpoff, %r11
    test %r11, %r11
    je 1f
    addq $1, 64(%r11)
1:  pop %r11
    jne f_count_end
    ud2

/* ---- the record body shared by both trace variants: time in r8, producer at %fs:producer ---- */
.macro APPEND kind, id, prefetch
    mov %fs:producer@tpoff+DEPTH, %r10d
    lea 1(%r10), %eax
    mov %eax, %fs:producer@tpoff+DEPTH
    mov $1, %edx
    xadd %rdx, %fs:producer@tpoff+RESERVE
    mov %rdx, %rax
    sub %fs:producer@tpoff+TAIL, %rax
    cmp %fs:producer@tpoff+MASK, %rax
    ja 9f
    mov %fs:producer@tpoff+MASK, %rax
    mov %fs:producer@tpoff+RECORDS, %rcx
.if \prefetch
    lea 128(%rdx), %rdi
    and %rax, %rdi
    shl $5, %rdi
    prefetchw (%rcx,%rdi)
.endif
    and %rax, %rdx
    shl $5, %rdx
    add %rcx, %rdx
    mov %r8, 0(%rdx)
    mov %fs:producer@tpoff+TID, %eax
    shl $32, %rax
    or \id, %rax
    mov %rax, 8(%rdx)
    movzwl %r10w, %eax
    shl $16, %eax
    or $\kind, %eax
    mov %rax, 16(%rdx)
    movq $0, 24(%rdx)
    mov %r10d, %fs:producer@tpoff+DEPTH
    test %r10d, %r10d
    jnz 4f
    mov %fs:producer@tpoff+RING, %rcx
3:  mov %fs:producer@tpoff+RESERVE, %rax
    mov %rax, HEAD(%rcx)
    cmp %fs:producer@tpoff+RESERVE, %rax
    jne 3b
4:
.endm

/* ---- today's path: the stub pushes site_end and id, jumps to the runtime ---- */
SITE f_runtime, s_runtime
s_runtime:
    pushq 1f(%rip)
    pushq $ID
    jmp *2f(%rip)
1:  .quad f_runtime_end
2:  .quad rt_entry

    .p2align 4
rt_entry:
    .irp reg, rax, rcx, rdx, rsi, rdi, r8, r9, r10
    push %\reg
    .endr
    cmpl $0, fast_clock(%rip)
    je 7f
    mov 64(%rsp), %esi
    cmp capacity(%rip), %esi
    jae 7f
    mov %rsi, %rax
    shl $6, %rax
    add probes(%rip), %rax
    cmpq $0, 8(%rax)
    jne 7f
    testl $0xffff00ff, 16(%rax)
    jne 7f
    mov 20(%rax), %r10d
    cmp stat_capacity(%rip), %r10d
    jae 7f
    mov stats@gottpoff(%rip), %rcx
    mov %fs:(%rcx), %rcx
    test %rcx, %rcx
    je 7f
    mov producer@gottpoff(%rip), %r9
    cmpq $0, %fs:RING(%r9)
    je 7f
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8
    imul $256, %r10, %rax
    addq $1, (%rcx,%rax)
    APPEND 1, %rsi, 1
    .irp reg, r10, r9, r8, rdi, rsi, rdx, rcx, rax
    pop %\reg
    .endr
    lea 16(%rsp), %rsp
    jmp *-8(%rsp)
7:  ud2
9:  ud2

/* ---- inlined at the site's stub: TLS at immediates, id an immediate ---- */
.macro INLINE name, end, clock, prefetch, checks
    .p2align 4
\name:
    push %rax
    push %rcx
    push %rdx
    push %r8
    push %r10
.if \prefetch
    push %rdi
.endif
.if \checks
    movabs $probe_state, %rax
    testl $0xffff00ff, (%rax)
    jne 7f
.endif
    mov %fs:stats@tpoff, %rcx
    test %rcx, %rcx
    je 7f
    cmpq $0, %fs:producer@tpoff+RING
    je 7f
.if \clock
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8
.else
    mov $12345, %r8d
.endif
    addq $1, 64(%rcx)
    APPEND 1, $ID, \prefetch
.if \prefetch
    pop %rdi
.endif
    pop %r10
    pop %r8
    pop %rdx
    pop %rcx
    pop %rax
    jmp \end
7:  ud2
9:  ud2
.endm
SITE f_inline, s_inline
INLINE s_inline, f_inline_end, 1, 1, 1
SITE f_inline_np, s_inline_np
INLINE s_inline_np, f_inline_np_end, 1, 0, 1
SITE f_inline_nc, s_inline_nc
INLINE s_inline_nc, f_inline_nc_end, 1, 1, 0
SITE f_inline_noclock, s_inline_noclock
INLINE s_inline_noclock, f_inline_noclock_end, 0, 1, 1

/* the inline body entered and left as today's (push site_end, push id, jmp *; lea; jmp *-8(%rsp)) */
SITE f_split, s_split
s_split:
    pushq 1f(%rip)
    pushq $ID
    jmp *2f(%rip)
1:  .quad f_split_end
2:  .quad split_body
    .p2align 4
split_body:
    push %rax
    push %rcx
    push %rdx
    push %r8
    push %r10
    push %rdi
    movabs $probe_state, %rax
    testl $0xffff00ff, (%rax)
    jne 7f
    mov %fs:stats@tpoff, %rcx
    test %rcx, %rcx
    je 7f
    cmpq $0, %fs:producer@tpoff+RING
    je 7f
    rdtsc
    shl $32, %rdx
    or %rdx, %rax
    mov %rax, %r8
    addq $1, 64(%rcx)
    APPEND 1, $ID, 1
    pop %rdi
    pop %r10
    pop %r8
    pop %rdx
    pop %rcx
    pop %rax
    lea 16(%rsp), %rsp
    jmp *-8(%rsp)
7:  ud2
9:  ud2

    .section .note.GNU-stack, "", @progbits
