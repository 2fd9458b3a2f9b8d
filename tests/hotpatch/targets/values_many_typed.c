/* values_many.c's one function whose DWARF is always there (built -g). */
__attribute__((noinline)) long typed_add(int a, long b) { return a + b; }
