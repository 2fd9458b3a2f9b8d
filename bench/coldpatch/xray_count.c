/*
 * Linked into the XRay builds of bench/coldpatch/flows.sh for probes on:
 * with XRAY_COUNT=1 in the environment every sled is patched at start-up to
 * call a handler that counts events per function, plainly, as iprobe's
 * count handler does per thread (the XRay runtime is linked statically, so
 * its symbols resolve here and nowhere else).
 */
#include <stdint.h>
#include <stdlib.h>

int __xray_set_handler(void (*entry)(int32_t, int));
int __xray_patch(void);

static unsigned long calls[1 << 16];

__attribute__((xray_never_instrument)) static void count(int32_t function, int type) {
    (void)type;
    calls[(uint32_t)function & 0xffff]++;
}

__attribute__((constructor, xray_never_instrument)) static void patch_when_asked(void) {
    const char* on = getenv("XRAY_COUNT");
    if (on && on[0] == '1') {
        __xray_set_handler(count);
        __xray_patch();
    }
}
