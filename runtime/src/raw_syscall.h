/* A system call without libc, for the runtime's own paths: libc may be
 * probed itself (attach --module libc.so.6), may use vector registers the
 * runtime does not save, and its errno is not ours to change. */
#pragma once

static inline long iprobe_rt_raw_syscall6(long n, long a, long b, long c, long d, long e, long f) {
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
