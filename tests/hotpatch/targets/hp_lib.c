/* A probed shared library for the hotpatch tests. */
volatile long hp_lib_sink;

__attribute__((noinline)) void lib_counted(long i) { hp_lib_sink += i; }
