/* A library that tests of `iprobe run --module` load with dlopen (or link
 * at start): WORK names its function, built once per name by CMake.  Its
 * constructor calls it once, before dlopen returns. */
#ifndef WORK
#error "build with -DWORK=name"
#endif

__attribute__((noinline)) int WORK(int x) {
    volatile int acc = x;
    for (int i = 0; i < 3; i++) acc = acc * 31 + i;
    return acc;
}

__attribute__((constructor)) static void at_load(void) { WORK(0); }
