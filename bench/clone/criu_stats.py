#!/usr/bin/env python3
"""frozen_time and freezing_time (ms) from CRIU's stats-dump image (the
bench/clone scripts): prints "FROZEN FREEZING"."""
import struct, sys
b = open(sys.argv[1], "rb").read()
(n,) = struct.unpack_from("<I", b, 8)
msg = b[12:12 + n]
def fields(m):
    i = 0
    while i < len(m):
        def varint():
            nonlocal i
            v = s = 0
            while True:
                c = m[i]; i += 1; v |= (c & 0x7f) << s; s += 7
                if c < 0x80: return v
        t = varint(); f, w = t >> 3, t & 7
        if w == 0: yield f, varint()
        elif w == 2:
            l = varint(); yield f, m[i:i + l]; i += l
        elif w == 1: i += 8
        elif w == 5: i += 4
d = dict(fields(dict(fields(msg))[1]))
print("%.1f %.1f" % (d.get(2, 0) / 1000, d.get(1, 0) / 1000))
