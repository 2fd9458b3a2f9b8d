/* A service confined by a seccomp filter, as systemd's SystemCallFilter= or
 * MemoryDenyWriteExecute= confine one (tests/hotpatch/messages_test.cpp):
 *   seccomp_target kill-memfd   memfd_create kills the process
 *   seccomp_target errno-memfd  memfd_create fails (EPERM)
 *   seccomp_target allow-list   only its own calls and an attach's
 *                               (hotpatch/src/seccomp_check.cpp) are allowed
 *   seccomp_target mdwe         writable and executable memory kills it
 *                               (mmap with both, mprotect adding exec)
 * then calls tick() in a loop, a line every 1000 calls. */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile long sink;
__attribute__((noinline)) long tick(long i) { sink += i; return sink; }

#define LOAD(field) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, field))
#define RET(action) BPF_STMT(BPF_RET | BPF_K, action)

static const int kAllowed[] = {
    /* its own */
    SYS_clock_nanosleep, SYS_nanosleep, SYS_write, SYS_exit_group, SYS_exit, SYS_rt_sigreturn, SYS_restart_syscall,
    /* an attach's */
    SYS_openat, SYS_read, SYS_pread64, SYS_newfstatat, SYS_fstat, SYS_mmap, SYS_mprotect, SYS_munmap, SYS_close,
    SYS_getpid, SYS_memfd_create, SYS_ftruncate, SYS_gettid, SYS_rt_sigprocmask, SYS_madvise, SYS_futex,
    SYS_process_vm_readv,
};

static int install(struct sock_filter* f, unsigned short n) {
    struct sock_fprog prog = {n, f};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

int main(int argc, char** argv) {
    const char* mode = argc > 1 ? argv[1] : "";
    struct sock_filter f[64];
    unsigned short n = 0;
    if (strcmp(mode, "kill-memfd") == 0 || strcmp(mode, "errno-memfd") == 0) {
        f[n++] = (struct sock_filter)LOAD(nr);
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_memfd_create, 0, 1);
        f[n++] = (struct sock_filter)RET(mode[0] == 'k' ? SECCOMP_RET_KILL_PROCESS : SECCOMP_RET_ERRNO | 1);
        f[n++] = (struct sock_filter)RET(SECCOMP_RET_ALLOW);
    } else if (strcmp(mode, "allow-list") == 0) {
        const int count = sizeof kAllowed / sizeof kAllowed[0];
        f[n++] = (struct sock_filter)LOAD(nr);
        for (int i = 0; i < count; i++)
            f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kAllowed[i], (unsigned char)(count - i), 0);
        f[n++] = (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS);
        f[n++] = (struct sock_filter)RET(SECCOMP_RET_ALLOW);
    } else if (strcmp(mode, "mdwe") == 0) {
        f[n++] = (struct sock_filter)LOAD(nr);                                                   /* 0 */
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 0, 3);         /* 1 */
        f[n++] = (struct sock_filter)LOAD(args[2]);                                              /* 2 */
        f[n++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, PROT_WRITE | PROT_EXEC); /* 3 */
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PROT_WRITE | PROT_EXEC, 3, 4); /* 4 */
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 0, 3);     /* 5 */
        f[n++] = (struct sock_filter)LOAD(args[2]);                                              /* 6 */
        f[n++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, PROT_EXEC, 0, 1);       /* 7 */
        f[n++] = (struct sock_filter)RET(SECCOMP_RET_KILL_PROCESS);                               /* 8 */
        f[n++] = (struct sock_filter)RET(SECCOMP_RET_ALLOW);                                      /* 9 */
    } else {
        fprintf(stderr, "usage: %s kill-memfd|errno-memfd|allow-list|mdwe\n", argv[0]);
        return 2;
    }
    printf("confined %s\n", mode);
    fflush(stdout);
    if (install(f, n)) return 1;
    for (long i = 0;; i++) {
        tick(i);
        if (i % 1000 == 0) {
            printf("tick %ld\n", i);
            fflush(stdout);
        }
        usleep(100);
    }
}
