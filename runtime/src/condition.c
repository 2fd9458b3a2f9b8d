/*
 * Evaluates a compiled `--when` condition (iprobe/formats/condition.h) in
 * the target, on the handler's path: straight-line code, bounded by
 * IPROBE_COND_MAX_OPS operations and IPROBE_COND_MAX_STRINGS string reads of
 * at most IPROBE_COND_STRING_MAX + 1 bytes, so its cost has a ceiling.
 */
#include "condition_eval.h"

#include <sys/syscall.h>
#include <sys/uio.h>

/* Raw syscalls: no libc on the handler's path (it may use vector registers
 * the runtime does not save, and errno is not ours to change). */
static inline long raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ __volatile__("syscall"
                         : "=a"(ret)
                         : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                         : "rcx", "r11", "memory");
    return ret;
}

uint64_t iprobe_cond_read_memory(void* out, uint64_t address, uint64_t size) {
    if (address == 0 || size == 0) return 0;
    /* The pid is asked each time: a forked child reads its own memory. */
    const long pid = raw_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    struct iovec local = {out, size};
    struct iovec remote = {(void*)(uintptr_t)address, size};
    const long got = raw_syscall6(SYS_process_vm_readv, pid, (long)&local, 1, (long)&remote, 1, 0);
    return got > 0 ? (uint64_t)got : 0;
}

int iprobe_cond_evaluate(const struct iprobe_cond_program* program, const struct iprobe_cond_values* values) {
    return iprobe_cond_holds(program, values);
}
