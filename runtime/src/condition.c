/*
 * Evaluates a compiled `--when` condition (iprobe/formats/condition.h) in
 * the target, on the handler's path: straight-line code, bounded by
 * IPROBE_COND_MAX_OPS operations and IPROBE_COND_MAX_STRINGS string reads of
 * at most IPROBE_COND_STRING_MAX + 1 bytes, so its cost has a ceiling.
 */
#include "condition_eval.h"
#include "raw_syscall.h"

#include <sys/syscall.h>
#include <sys/uio.h>

uint64_t iprobe_cond_read_memory(void* out, uint64_t address, uint64_t size) {
    if (address == 0 || size == 0) return 0;
    /* The pid is asked each time: a forked child reads its own memory. */
    const long pid = iprobe_rt_raw_syscall6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    struct iovec local = {out, size};
    struct iovec remote = {(void*)(uintptr_t)address, size};
    const long got = iprobe_rt_raw_syscall6(SYS_process_vm_readv, pid, (long)&local, 1, (long)&remote, 1, 0);
    return got > 0 ? (uint64_t)got : 0;
}

int iprobe_cond_evaluate(const struct iprobe_cond_program* program, const struct iprobe_cond_values* values) {
    return iprobe_cond_holds(program, values);
}
