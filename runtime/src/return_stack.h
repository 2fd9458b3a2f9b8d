/*
 * Return trampolines: how an enabled function-entry site hooks the
 * function's return (docs/hotpatch.md, "Exits through return trampolines").
 *
 * The entry handler keeps the real return address in an entry of a global
 * pool, and the function goes on through that entry's own unit of a sled,
 * 32 bytes each:
 *
 *   unit i + 0:   call *-16(%rsp)     the function's body (at the site's end, which the
 *                                     entry left below the stack); pushes unit + 4, the
 *                                     trampoline, into the return-address slot and the
 *                                     return stack buffer
 *   unit i + 4:   mov %r11, -8(%rsp)  the caller's r11, kept (callers may hold values in it)
 *                 lea unit(%rip), %r11
 *                 jmp iprobe_rt_return_common
 *   unit i + 24:  .quad &pool[i] - (unit i + 24)
 *
 * The function's `ret` comes to unit + 4 as the return stack buffer
 * predicted, and the common tail leaves with a `ret` to the real return
 * address, which pops the caller's own prediction: no return is mispredicted.
 *
 * Because every entry has its own trampoline, a return finds its entry from
 * the trampoline's address alone: no per-thread stack is searched, so
 * longjmp, exceptions, swapcontext, signal handlers on another stack and
 * tail calls (the slot already holds a trampoline: the entries chain) need
 * no special case.  The sled's CFI computes the real return address the same
 * way (DW_CFA_val_expression: the unit from the return address column, the
 * entry from the unit's self-relative pointer), so libgcc's unwinder (C++
 * exceptions, pthread_cancel, backtrace()) and gdb walk through hooked
 * frames without any hook of theirs.
 *
 * The pool is shared by all threads in chunks; each thread uses its chunks
 * as a stack (push at entry, pop when the top entry returns).  An entry
 * whose frame was abandoned (longjmp, exception) stays until a slow path
 * finds it dead: its slot no longer holds its trampoline and no other entry
 * returns into it.
 *
 * Included by C (rt.c, return_stack.c) and by the assembler
 * (return_trampolines.S): offsets below are checked against the structs.
 */
#ifndef IPROBE_RT_RETURN_STACK_H
#define IPROBE_RT_RETURN_STACK_H

#define IPROBE_RT_RETURN_ENTRIES 32768 /* the pool: entries for every thread */
#define IPROBE_RT_RETURN_CHUNK 32      /* entries a thread claims at a time */
#define IPROBE_RT_RETURN_MAX_CHUNKS 32 /* per thread: IPROBE_RT_RETURN_STACK_FRAMES hooked frames deep */
#define IPROBE_RT_RETURN_ENTRY_SIZE 32
#define IPROBE_RT_RETURN_UNIT_SIZE 32  /* sled unit; pool index = (unit - sled) / 32 */
#define IPROBE_RT_RETURN_UNIT_TRAMPOLINE 4 /* where the hooked function returns to */
#define IPROBE_RT_RETURN_UNIT_ENTRY 24     /* the unit's self-relative pointer to its entry */

/* struct iprobe_rt_return.handler */
#define IPROBE_RT_RETURN_COUNT 1    /* arg: byte offset of `completed` in the thread's sums */
#define IPROBE_RT_RETURN_TRACE 2    /* arg: exit probe; cookie: 1 when the entry pushed a timed frame */
#define IPROBE_RT_RETURN_CALLBACK 3 /* + k: registered callback k (iprobe_rt_hook_return); cookie: its argument */
#define IPROBE_RT_RETURN_CALLBACKS 4

/* Offsets for the assembler. */
#define RET_ENTRY_RET 0
#define RET_ENTRY_SLOT 8
#define RET_ENTRY_HANDLER 16
#define RET_ENTRY_ARG 20
#define RET_ENTRY_COOKIE 24
#define RET_THREAD_NEXT 0   /* in struct iprobe_rt_thread_state */
#define RET_THREAD_LIMIT 8
#define RET_THREAD_STATS 16 /* the thread's sums, 0 until it has a slot (count stubs read it too) */

#ifdef __ASSEMBLER__
/* WHEN_RESTORE: the registers iprobe_rt_trace_enter_return_nop saves
 * (return_trampolines.S), back; trace_fast.S's entry goes on with them. */
.macro WHEN_RESTORE
    pop %r11
    .cfi_adjust_cfa_offset -8
    pop %rdx
    .cfi_adjust_cfa_offset -8
    pop %rcx
    .cfi_adjust_cfa_offset -8
    pop %rax
    .cfi_adjust_cfa_offset -8
.endm
/* RETURN_UNIT_OF entry, scratch: `entry` (a pool entry) becomes its unit,
 * sled + (entry - pool): units and entries are the same size. */
.macro RETURN_UNIT_OF entry, scratch
    lea iprobe_rt_return_pool(%rip), \scratch
    sub \scratch, \entry
    lea iprobe_rt_return_sled(%rip), \scratch
    add \scratch, \entry
.endm
#else
#include <stddef.h>
#include <stdint.h>

struct iprobe_rt_return {
    uint64_t ret;     /* the real return address; 0 when the entry is free */
    uint64_t slot;    /* the stack slot holding this entry's trampoline */
    uint32_t handler; /* IPROBE_RT_RETURN_* */
    uint32_t arg;
    uint64_t cookie;
};

/* The runtime's per-thread state the assembler reads too, one
 * initial-exec TLS block (the static TLS surplus a dlopen'ed library may use
 * is small).  Its return-stack part survives fork; `stats` is cleared in a
 * forked child (the parent's region is unmapped there). */
struct iprobe_rt_thread_state {
    /* [next, limit): a run of free entries of the thread's chunks, taken
     * from `next` up by hooks and given back from the top by LIFO returns
     * (next == limit: find another run on the slow path) */
    struct iprobe_rt_return* next;
    struct iprobe_rt_return* limit;
    void* stats;                    /* the thread's sums (struct iprobe_rt_fn_stats[]), 0 until it has a slot */
    uint32_t token;                 /* owner token of its chunks (survives fork, unlike the tid) */
    uint8_t pool_empty;             /* its last slow path found no room because the pool had no chunk left */
    uint8_t count;                  /* chunks held */
    uint8_t busy;                   /* in a slow path: a nested hook (signal) is not taken */
    uint8_t retired;                /* the thread is exiting: no more hooks */
    uint16_t chunks[IPROBE_RT_RETURN_MAX_CHUNKS];
    /* Deeper than its return stack, a thread comes to the slow path at each
     * call: a collection (a system call reading every held slot) is then
     * made only every collect_backoff-th time while collections free
     * nothing (doubling up to 1024), instead of at every call. */
    uint16_t collect_skip;
    uint16_t collect_backoff;
};

_Static_assert(sizeof(struct iprobe_rt_return) == IPROBE_RT_RETURN_ENTRY_SIZE, "entry size");
_Static_assert(offsetof(struct iprobe_rt_return, ret) == RET_ENTRY_RET, "entry layout");
_Static_assert(offsetof(struct iprobe_rt_return, slot) == RET_ENTRY_SLOT, "entry layout");
_Static_assert(offsetof(struct iprobe_rt_return, handler) == RET_ENTRY_HANDLER, "entry layout");
_Static_assert(offsetof(struct iprobe_rt_return, arg) == RET_ENTRY_ARG, "entry layout");
_Static_assert(offsetof(struct iprobe_rt_return, cookie) == RET_ENTRY_COOKIE, "entry layout");
_Static_assert(offsetof(struct iprobe_rt_thread_state, next) == RET_THREAD_NEXT, "thread layout");
_Static_assert(offsetof(struct iprobe_rt_thread_state, limit) == RET_THREAD_LIMIT, "thread layout");
_Static_assert(offsetof(struct iprobe_rt_thread_state, stats) == RET_THREAD_STATS, "thread layout");

#endif
#endif
