#!/usr/bin/env python3
"""Writes one C file of N functions `long PREFIX<i>(long a, long b)` and their
table PREFIX_table; with --main, also a main that calls every function of
its own table and of the tables named after it once, prints the sum and
exits (the target of values_scale.sh: how long planning --args --retval of
N functions takes, built with and without -g).
usage: gen_values_functions.py N PREFIX [--main OTHER_PREFIX:COUNT ...]"""
import sys

n, prefix = int(sys.argv[1]), sys.argv[2]
others = [a.split(":") for a in sys.argv[4:]] if sys.argv[3:4] == ["--main"] else None
out = []
for i in range(n):
    # a body too long to be refused ("too short") and unlike every other (no folding)
    out.append(f"__attribute__((noinline)) long {prefix}{i}(long a, long b) {{ return a * {i + 3} ^ b; }}\n")
out.append(f"long (*const {prefix}_table[])(long, long) = {{\n")
out.append(",\n".join(f"{prefix}{i}" for i in range(n)))
out.append("};\n")
if others is not None:
    out.append("#include <stdio.h>\n")
    for p, count in others:
        out.append(f"extern long (*const {p}_table[{count}])(long, long);\n")
    out.append("int main(void) {\n    long sum = 0;\n")
    for p, count in [(prefix, n)] + [(p, int(c)) for p, c in others]:
        out.append(f"    for (long i = 0; i < {count}; i++) sum += {p}_table[i](i, 1);\n")
    out.append('    printf("sum %ld\\n", sum);\n    return 0;\n}\n')
sys.stdout.write("".join(out))
