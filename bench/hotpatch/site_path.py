#!/usr/bin/env python3
"""The instructions an enabled entry site executes on its fast path, read
from a live process (callgrind cannot run a process iprobe attaches to):
the site's `jmp` and its stub up to the jump back into the function.
usage: site_path.py PID BINARY FUNCTION   (prints the count, then the listing)"""
import json
import subprocess
import sys
import tempfile

pid, binary, function = int(sys.argv[1]), sys.argv[2], sys.argv[3]
iprobe = sys.argv[4] if len(sys.argv) > 4 else "iprobe"
listing = json.loads(subprocess.run([iprobe, "list", binary, "--json", "--functions", function],
                                    check=True, capture_output=True, text=True).stdout)
entry = next(p for p in listing["probes"] if p["kind"] == "entry")
bias = 0
if "pie" in listing["flags"]:
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].endswith("/" + listing["module"]) and int(fields[2], 16) == 0:
                bias = int(fields[0].split("-")[0], 16)
                break
site = bias + entry["site"]
with open(f"/proc/{pid}/mem", "rb") as mem:
    mem.seek(site)
    jump = mem.read(5)
    if jump[0] != 0xE9:
        sys.exit(f"{function}: site {site:#x} holds {jump.hex()}, not an enabled entry's jmp")
    stub = site + 5 + int.from_bytes(jump[1:5], "little", signed=True)
    mem.seek(stub)
    code = mem.read(64)
with tempfile.NamedTemporaryFile() as f:
    f.write(code)
    f.flush()
    text = subprocess.run(["objdump", "-D", "-b", "binary", "-mi386:x86-64", f"--adjust-vma={stub:#x}", f.name],
                          check=True, capture_output=True, text=True).stdout
path = ["jmp (the site)"]
for line in text.splitlines():
    parts = line.split("\t")
    if len(parts) < 3 or not parts[0].strip().endswith(":"):
        continue
    insn = parts[2].strip()
    path.append(insn)
    mnemonic = insn.split()[0]
    # The fast path ends where it goes back to the function (jne site_end)
    # or leaves for the handler (jmp).
    if mnemonic in ("jne", "jmp", "ret") and not insn.startswith("jmp    *0x0(%rip)"):
        break
print(len(path))
for insn in path:
    print("  " + insn)
