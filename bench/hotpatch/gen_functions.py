#!/usr/bin/env python3
"""Writes a C program with N empty functions that T threads (default 8) call
round-robin (the target of the stop-the-world pause benchmark).
usage: gen_functions.py N [T]"""
import sys

n = int(sys.argv[1])
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 8
out = [
    "#include <pthread.h>\n#include <stdio.h>\n#include <unistd.h>\n",
    "volatile long sink;\n",
]
for i in range(n):
    out.append(f"__attribute__((noinline)) void f{i}(void) {{ sink++; }}\n")
out.append("typedef void (*fn)(void);\nstatic fn table[] = {\n")
out.append(",\n".join(f"f{i}" for i in range(n)))
out.append("};\n")
out.append(f"#define SPINNING_THREADS {threads}\n")
out.append("""
static void* spin(void* arg) {
    (void)arg;
    for (;;)
        for (unsigned long i = 0; i < sizeof table / sizeof table[0]; i++) table[i]();
    return 0;
}
int main(void) {
    pthread_t t[SPINNING_THREADS];
    for (int i = 0; i < SPINNING_THREADS; i++) pthread_create(&t[i], 0, spin, 0);
    printf("ready\\n");
    fflush(stdout);
    for (;;) pause();
}
""")
sys.stdout.write("".join(out))
