/* `iprobe run`'s channel once the program runs: the libraries it loads
 * later (dlopen, dlmopen, and what those bring in), told to the prober
 * before any of their code runs, so that a --module or --probes target the
 * program had not loaded at its start is probed as it appears.
 *
 * Sender: libiprobe-run-audit.so (runtime/src/run_audit.c), an rtld-audit(7)
 * module that `iprobe run` adds to LD_AUDIT when it names modules.  At each
 * LA_ACT_CONSISTENT after the program's start-up set (the new objects mapped
 * and relocated, their constructors not yet run) it sends one batch on the
 * socket in IPROBE_RUN_FD (a copy of its own, close-on-exec) and waits for
 * one byte back; the loader's lock is held meanwhile, so
 * concurrent dlopens queue behind it.  A batch: per object, a uint16_t
 * length (host order, 1..IPROBE_RUN_LOADS_MAX_NAME) and its l_name, then a
 * uint16_t 0.  The answer: IPROBE_RUN_LOADS_WATCH (go on, modules are still
 * pending) or IPROBE_RUN_LOADS_GO (go on, nothing is: the module closes its
 * copy and stops sending).  The prober closing its end (iprobe gone) ends
 * the watch the same way.  Receiver: hotpatch/src/run.cpp,
 * serve_later_loads. */
#ifndef IPROBE_RUNTIME_RUN_LOADS_H
#define IPROBE_RUNTIME_RUN_LOADS_H

#define IPROBE_RUN_FD_VARIABLE "IPROBE_RUN_FD"
/* LD_AUDIT as the user had it ("" for none); present only when `iprobe run`
 * added the module, which the runtime's constructor then takes back out. */
#define IPROBE_RUN_AUDIT_VARIABLE "IPROBE_RUN_LD_AUDIT"
#define IPROBE_RUN_AUDIT_LIBRARY "libiprobe-run-audit.so"
#define IPROBE_RUN_LOADS_MAX_NAME 4096
#define IPROBE_RUN_LOADS_GO 0
/* The prober's answer to the start-up hold (run.h) and to a batch when
 * modules are still pending: go on, the audit module's copy of the channel
 * stays open.  Any other go-ahead (0) has the runtime (at the start) or the
 * module (at a load) close that copy, so the program is left no descriptor
 * once nothing is pending. */
#define IPROBE_RUN_LOADS_WATCH 'w'

/* Where the audit module's copy goes (F_DUPFD_CLOEXEC's floor), far above
 * the descriptors a program counts on being next, for RLIMIT_NOFILE's soft
 * limit `open_files`; the runtime looks for it in
 * [floor, floor + IPROBE_RUN_AUDIT_FD_SPAN). */
#define IPROBE_RUN_AUDIT_FD_SPAN 64
static inline int iprobe_run_audit_fd_floor(unsigned long long open_files) {
    if (open_files <= 64) return 3;
    return open_files > 1024 ? 1000 : (int)(open_files / 2);
}
#endif
