#!/usr/bin/env python3
"""One row of bench/debug-window/run.sh from an `iprobe debug --json` session.

usage: summarize.py SESSION_OUT LOAD MODE RATE C1 REQUEST_BYTES BUFFER RUN_S
"""
import json
import sys


def main():
    out, load, mode, rate, c1, req, buffer, run_s = sys.argv[1:]
    rate, c1, req, run_s = float(rate), float(c1), float(req), float(run_s)
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    buf = float(buffer[:-1]) * unit[buffer[-1]] if buffer[-1] in unit else float(buffer)
    events = [json.loads(line) for line in open(out) if line.startswith("{")]
    start = next(e["t_s"] for e in events if e["event"] == "mirror")
    end = start + run_s
    reclones = [e for e in events if e["event"] == "reclone"]
    stats = next(e["stats"] for e in events if e["event"] == "stopping")
    # The mirror's own measure: a connection's start to its overflow.
    windows = stats["debug_windows_ms"]["recent"]
    first = "%.2f s" % (windows[0] / 1000) if windows else "none"
    mirrored = stats["bytes"]["to_debug"] / max(1, stats["bytes"]["client_to_production"])
    cut = stats["debug"]["linger_timeouts"]
    # Share of the functions probed, time-weighted over the load; each new
    # generation starts with all of them.
    share, t, on = 0.0, start, 1.0
    for e in events:
        if e["event"] not in ("reclone", "adapt") or e["t_s"] >= end:
            continue
        at = max(e["t_s"], start)
        share += on * (at - t)
        t, on = at, 1.0 if e["event"] == "reclone" else e["probed"] / e["of"]
    share += on * (end - t)
    lam, mu = rate * req, c1 * req
    model = "inf" if lam <= mu else "%.2f-%.2f s" % (buf / (lam - mu), (buf + 256 * 1024) / (lam - mu))
    print("%-6s %-6s %9.0f %12s %9d %9d %6d %9.0f%% %8.1f%% %12s" % (
        load + "%", mode, rate, first, stats["buffer"]["overflows"], len(reclones), cut, 100 * mirrored,
        100 * share / run_s, model if mode == "fixed" else ""), flush=True)


if __name__ == "__main__":
    main()
