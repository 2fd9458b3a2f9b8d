/*
 * Ground truth for probe names: an LD_PRELOAD library defining the
 * -finstrument-functions hooks.  Each distinct hook call site is written once
 * to $IPROBE_HOOK_LOG as "<E|X> <return address> <this_fn>" (link-time
 * addresses of the main program: its load bias is subtracted), so a test can
 * check that the probe at that site names the function the compiler passed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NO_HOOKS __attribute__((no_instrument_function))
#define SLOTS 65536

static uintptr_t main_bias;
static uintptr_t seen[SLOTS];
static int log_fd = -1;
static volatile int lock;

NO_HOOKS static int first_callback(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    *(uintptr_t *)data = info->dlpi_addr;
    return 1; /* the main program comes first */
}

NO_HOOKS __attribute__((constructor)) static void recorder_init(void) {
    dl_iterate_phdr(first_callback, &main_bias);
    const char *path = getenv("IPROBE_HOOK_LOG");
    if (path) log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

NO_HOOKS static void record(char kind, uintptr_t ret, void *fn) {
    if (log_fd < 0) return;
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE)) {
    }
    size_t slot = (ret >> 2) % SLOTS;
    int fresh = 0;
    for (size_t n = 0; n < SLOTS; ++n, slot = (slot + 1) % SLOTS) {
        if (seen[slot] == ret) break;
        if (seen[slot] == 0) {
            seen[slot] = ret;
            fresh = 1;
            break;
        }
    }
    __atomic_store_n(&lock, 0, __ATOMIC_RELEASE);
    if (!fresh) return;
    char line[64];
    int len = snprintf(line, sizeof line, "%c %lx %lx\n", kind, (unsigned long)(ret - main_bias),
                       (unsigned long)((uintptr_t)fn - main_bias));
    if (write(log_fd, line, (size_t)len) < 0) return;
}

NO_HOOKS void __cyg_profile_func_enter(void *fn, void *call_site) {
    (void)call_site;
    record('E', (uintptr_t)__builtin_return_address(0), fn);
}

NO_HOOKS void __cyg_profile_func_exit(void *fn, void *call_site) {
    (void)call_site;
    record('X', (uintptr_t)__builtin_return_address(0), fn);
}
