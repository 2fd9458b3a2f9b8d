/*
 * A stand-in for `iprobe attach` used by the llvm-pass tests: linked into a
 * test program (compiled WITHOUT the pass), it reads the program's own
 * iprobe_sites section, turns every placeholder NOP into `call` to a
 * register-preserving trampoline, counts events per site and logs point
 * arguments.  A function's entry (its patchable entry, found through
 * __patchable_function_entries) also hooks its return, the way the runtime
 * does but with a plain per-thread stack: these programs neither longjmp
 * nor throw.  It proves the placeholders are safe to enable at every
 * placement (red zone, registers, alignment) and the returns safe to hook
 * independently of hotpatch.
 *
 * IPROBE_SELFPATCH_OUT=FILE enables it; the report goes to FILE so the
 * program's own output stays comparable byte for byte.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "iprobe/formats/probe_list.h"

#define MAX_SITES 8192
#define MAX_POINT_EVENTS 4096

extern const uint8_t __start_iprobe_sites[] __attribute__((weak));
extern const uint8_t __stop_iprobe_sites[] __attribute__((weak));
extern const uintptr_t __start___patchable_function_entries[] __attribute__((weak));
extern const uintptr_t __stop___patchable_function_entries[] __attribute__((weak));

struct site {
    uintptr_t address;
    const struct iprobe_site_entry* entry;
    unsigned long count;
    unsigned long returns; /* function entries: hooked returns taken */
};

#define MAX_DEPTH 4096
struct hooked {
    uintptr_t return_address;
    int site;
};
static __thread struct hooked hooked[MAX_DEPTH];
static __thread int hooked_depth;
void selfpatch_return(void);

struct point_event {
    const struct iprobe_site_entry* entry;
    uint64_t args[4];
};

static struct site sites[MAX_SITES];
static int site_count;
static struct point_event point_events[MAX_POINT_EVENTS];
static unsigned long point_event_count;
static unsigned long unaligned_calls;
static const char* report_path;

struct saved_registers { /* pushed by the trampoline, lowest address first */
    uint64_t r11, r10, r9, r8, rdi, rsi, rdx, rcx, rax, flags;
};

/* Called by the trampoline with the probe's return address (site + 5). */
__attribute__((used)) static void selfpatch_event(uintptr_t return_address, struct saved_registers* regs,
                                                  uintptr_t stack_at_call) {
    const uintptr_t site_address = return_address - 5;
    for (int i = 0; i < site_count; ++i) {
        if (sites[i].address != site_address) continue;
        __atomic_fetch_add(&sites[i].count, 1, __ATOMIC_RELAXED);
        if (sites[i].entry->flags & IPROBE_SITE_FLAG_FUNCTION_ENTRY) {
            /* the function's first instruction: its return address is right above */
            uintptr_t* slot = (uintptr_t*)stack_at_call;
            if (hooked_depth == MAX_DEPTH) abort();
            hooked[hooked_depth].return_address = *slot;
            hooked[hooked_depth].site = i;
            hooked_depth++;
            *slot = (uintptr_t)selfpatch_return;
        }
        /* A leaf function may leave %rsp only 4-aligned (nothing in it calls):
           the trampoline aligns for itself.  Count what we see for the record. */
        if (stack_at_call % 16 != 8) __atomic_fetch_add(&unaligned_calls, 1, __ATOMIC_RELAXED);
        if (sites[i].entry->kind == IPROBE_KIND_POINT) {
            const unsigned long n = __atomic_fetch_add(&point_event_count, 1, __ATOMIC_RELAXED);
            if (n < MAX_POINT_EVENTS) {
                point_events[n].entry = sites[i].entry;
                point_events[n].args[0] = regs->rdi;
                point_events[n].args[1] = regs->rsi;
                point_events[n].args[2] = regs->rdx;
                point_events[n].args[3] = regs->rcx;
            }
        }
        return;
    }
    abort(); /* a call from somewhere that is not a recorded site */
}

/* A hooked function returned: count it, give the real return address. */
__attribute__((used)) static uintptr_t selfpatch_returned(void) {
    if (hooked_depth == 0) abort();
    const struct hooked h = hooked[--hooked_depth];
    __atomic_fetch_add(&sites[h.site].returns, 1, __ATOMIC_RELAXED);
    return h.return_address;
}

/* Every caller-saved register (GPRs, flags, x87/SSE state via fxsave) saved,
   the stack aligned; rbp points at the saved rbp, above it r11 ... rax, flags. */
#define SAVE_EVERYTHING                                                  \
    "  pushfq\n"                                                         \
    "  push %rax\n push %rcx\n push %rdx\n push %rsi\n push %rdi\n"        \
    "  push %r8\n push %r9\n push %r10\n push %r11\n"                    \
    "  push %rbp\n"                                                      \
    "  mov %rsp, %rbp\n"                                                 \
    "  and $-64, %rsp\n"                                                 \
    "  sub $512, %rsp\n"                                                 \
    "  fxsave64 (%rsp)\n"
#define RESTORE_EVERYTHING                                               \
    "  fxrstor64 (%rsp)\n"                                               \
    "  mov %rbp, %rsp\n"                                                 \
    "  pop %rbp\n"                                                       \
    "  pop %r11\n pop %r10\n pop %r9\n pop %r8\n"                        \
    "  pop %rdi\n pop %rsi\n pop %rdx\n pop %rcx\n pop %rax\n"            \
    "  popfq\n"

/* Reached by a hooked function's `ret`: everything saved, then a jump to
   the real return address through r11 (free on return). */
__asm__(".text\n"
        ".globl selfpatch_return\n"
        ".type selfpatch_return,@function\n"
        "selfpatch_return:\n"
        "  sub $8, %rsp\n" /* room for the real return address */
        SAVE_EVERYTHING
        "  call selfpatch_returned\n"
        "  mov %rax, 88(%rbp)\n"
        RESTORE_EVERYTHING
        "  pop %r11\n"
        "  jmp *%r11\n"
        ".size selfpatch_return, .-selfpatch_return\n");

/* Saves everything, calls selfpatch_event, restores. */
__asm__(".text\n"
        ".globl selfpatch_trampoline\n"
        ".type selfpatch_trampoline,@function\n"
        "selfpatch_trampoline:\n"
        SAVE_EVERYTHING
        "  mov 88(%rbp), %rdi\n"   /* return address: above rbp + 9 GPRs + flags */
        "  lea 8(%rbp), %rsi\n"    /* struct saved_registers */
        "  lea 96(%rbp), %rdx\n"   /* %rsp before the call pushed its return address */
        "  call selfpatch_event\n"
        RESTORE_EVERYTHING
        "  ret\n"
        ".size selfpatch_trampoline, .-selfpatch_trampoline\n");
void selfpatch_trampoline(void);

static void make_writable(uintptr_t address, int writable) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t start = address & ~(page - 1);
    const int prot = PROT_READ | PROT_EXEC | (writable ? PROT_WRITE : 0);
    if (mprotect((void*)start, (address + 5 - start + page - 1) & ~(page - 1), prot) != 0) {
        perror("selfpatch: mprotect");
        abort();
    }
}

static void report(void) {
    FILE* out = fopen(report_path, "w");
    if (!out) return;
    for (int i = 0; i < site_count; ++i) {
        const struct iprobe_site_entry* e = sites[i].entry;
        const char* kind = e->kind == IPROBE_KIND_ENTRY ? "entry" : e->kind == IPROBE_KIND_EXIT ? "exit" : "point";
        fprintf(out, "site %s %s %lu\n", kind, (const char*)(e + 1), sites[i].count);
        if (e->flags & IPROBE_SITE_FLAG_FUNCTION_ENTRY)
            fprintf(out, "site exit %s %lu\n", (const char*)(e + 1), sites[i].returns);
    }
    const unsigned long logged = point_event_count < MAX_POINT_EVENTS ? point_event_count : MAX_POINT_EVENTS;
    for (unsigned long i = 0; i < logged; ++i) {
        const struct point_event* p = &point_events[i];
        fprintf(out, "point %s", (const char*)(p->entry + 1));
        for (unsigned a = 0; a < p->entry->arg_count; ++a) fprintf(out, " %#llx", (unsigned long long)p->args[a]);
        fprintf(out, "\n");
    }
    fprintf(out, "unaligned %lu\n", unaligned_calls);
    fclose(out);
}

__attribute__((constructor(101))) static void selfpatch_enable(void) {
    report_path = getenv("IPROBE_SELFPATCH_OUT");
    if (!report_path || !__start_iprobe_sites) return;
    const uint8_t* cursor = __start_iprobe_sites;
    while (cursor + sizeof(struct iprobe_site_entry) <= __stop_iprobe_sites) {
        const struct iprobe_site_entry* e = (const struct iprobe_site_entry*)cursor;
        if (e->size == 0) {
            cursor += IPROBE_SITE_ENTRY_ALIGN;
            continue;
        }
        if (site_count == MAX_SITES) abort();
        uintptr_t address = (uintptr_t)&e->site + (intptr_t)e->site;
        if (e->flags & IPROBE_SITE_FLAG_FUNCTION_ENTRY) {
            /* the NOP the compiler listed at the function's start */
            const uintptr_t function = (uintptr_t)&e->function + (intptr_t)e->function;
            address = 0;
            for (const uintptr_t* p = __start___patchable_function_entries; p < __stop___patchable_function_entries; ++p)
                if (e->function && *p >= function && *p - function <= 4) address = *p;
            if (!address || memcmp((const void*)address, "\x0f\x1f\x44\x00", 4) != 0) abort();
        } else if (memcmp((const void*)address, "\x0f\x1f\x44\x00\x00", 5) != 0) {
            abort();
        }
        sites[site_count].address = address;
        sites[site_count].entry = e;
        ++site_count;
        cursor += e->size;
    }
    for (int i = 0; i < site_count; ++i) {
        uint8_t call[5] = {0xe8};
        const int32_t rel = (int32_t)((intptr_t)selfpatch_trampoline - (intptr_t)(sites[i].address + 5));
        memcpy(call + 1, &rel, 4);
        make_writable(sites[i].address, 1);
        memcpy((void*)sites[i].address, call, 5);
        make_writable(sites[i].address, 0);
    }
    atexit(report);
}
