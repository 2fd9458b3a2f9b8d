#!/usr/bin/env python3
"""Folds pause_breakdown.bt's events into one row per stop (one tool process:
an attach or a detach), then prints the medians per label.

usage: pause_breakdown.py EVENTS TARGET_PID LABELS
LABELS: a file of "PID LABEL" lines, the tool process that made each stop
(e.g. "4711 this build enable"); stops of TARGET_PID by other processes, and
every stop of other targets, are left out."""
import collections
import statistics
import sys

SEIZE, INTERRUPT, DETACH = 0x4206, 0x4207, 17
TRACED = 0x8


def parse(path):
    ev = []
    for line in open(path):
        f = line.split()
        if not f or f[0] not in ("P", "W", "S", "MW", "MR", "OFF", "ON", "F"):
            continue
        ev.append(f)
    return ev


def stops(events):
    """Per tool tid, in order of first seize: its calls; plus the target's switches."""
    by_tool = collections.OrderedDict()
    switches = []
    for f in events:
        k = f[0]
        if k == "P":
            tool, req, arg, t0, t1, ret = int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[5]), int(f[6])
            if req == SEIZE and tool not in by_tool:
                by_tool[tool] = []
            if tool in by_tool:
                by_tool[tool].append(("P", req, arg, t0, t1, ret))
        elif k == "W":
            tool = int(f[1])
            if tool in by_tool:
                by_tool[tool].append(("W", int(f[2]), int(f[3]), int(f[4]), int(f[5])))
        elif k == "S":
            tool = int(f[1])
            if tool in by_tool:
                by_tool[tool].append(("S", int(f[2]), int(f[3])))
        elif k == "F":
            tool = int(f[1])
            if tool in by_tool:
                by_tool[tool].append(("F", int(f[2]), int(f[2])))
        elif k in ("MW", "MR"):
            tool = int(f[1])
            if tool in by_tool:
                by_tool[tool].append((k, int(f[2]), int(f[3]), int(f[4])))
        elif k == "OFF":
            switches.append(("OFF", int(f[1]), int(f[2]), int(f[3])))
        else:
            switches.append(("ON", int(f[1]), int(f[2])))
    return by_tool, switches


def fold(calls, switches):
    p = [c for c in calls if c[0] == "P"]
    seizes = [c for c in p if c[1] == SEIZE]
    ints = [c for c in p if c[1] == INTERRUPT]
    dets = [c for c in p if c[1] == DETACH]
    if not seizes or not dets:
        return None
    tids = {c[2] for c in seizes}
    first = min(c[3] for c in ints) if ints else min(c[3] for c in seizes)
    det0 = min(c[3] for c in dets)
    det1 = max(c[4] for c in dets)
    # the tool sees the last thread stopped: the wait4 that reports the last tid
    seen, all_stopped = set(), None
    for c in calls:
        if c[0] == "W" and c[2] < det0 and c[4] in tids:
            seen.add(c[4])
            if seen >= tids:
                all_stopped = c[3]
                break
    if all_stopped is None:
        return None
    waits = [c for c in calls if c[0] == "W" and first <= c[2] <= all_stopped]
    sleeps = [c for c in calls if c[0] == "S" and first <= c[1] <= all_stopped]
    writes = [c for c in calls if c[0] == "MW" and all_stopped <= c[1] <= det0]
    reads = [c for c in calls if c[0] == "MR" and all_stopped <= c[1] <= det0]
    faults = [c for c in calls if c[0] == "F" and all_stopped <= c[1] <= det0]
    # the target: each thread's stop (first switch out in state t) and its
    # first switch in after its own detach
    det_of = {c[2]: c[3] for c in dets}
    off, on = {}, {}
    for s in switches:
        if s[0] == "OFF" and s[1] in tids and s[1] not in off and s[3] & TRACED and first <= s[2] <= det1:
            off[s[1]] = s[2]
        if s[0] == "ON" and s[1] in det_of and s[1] not in on and det_of[s[1]] <= s[2] <= det1 + 30000000:
            on[s[1]] = s[2]
    gaps = [on[t] - off[t] for t in off if t in on]
    late = sum(1 for t in off if t not in on)
    us = lambda ns: ns / 1000.0
    return {
        "threads": len(tids),
        "seize+interrupt calls": us(sum(c[4] - c[3] for c in seizes + ints)),
        "first interrupt to all stopped (tool)": us(all_stopped - first),
        "wait4 calls": len(waits),
        "sleeps (nanosleep)": len(sleeps),
        "slept": us(sum(c[2] - c[1] for c in sleeps)),
        "last thread stopped (kernel) after first": us(max(off.values()) - first) if off else float("nan"),
        "in-stop work": us(det0 - all_stopped),
        "mem writes": len(writes),
        "mem write time": us(sum(c[2] - c[1] for c in writes)),
        "mem reads": len(reads),
        "page faults of the tool": len(faults),
        "detach calls (resume)": us(det1 - det0),
        "tool pause (first interrupt to last detach)": us(det1 - first),
        "target: thread gap median": us(statistics.median(gaps)) if gaps else float("nan"),
        "target: thread gap max": us(max(gaps)) if gaps else float("nan"),
        "threads not run within 30 ms of their detach": late,
        "target: first stop to last resumed": us(max(on.values()) - min(off.values())) if off and on else float("nan"),
    }


def main():
    events = parse(sys.argv[1])
    target = int(sys.argv[2])
    labels = {}
    for line in open(sys.argv[3]):
        pid, label = line.rstrip("\n").split(" ", 1)
        labels[int(pid)] = label
    by_tool, switches = stops(events)
    rows = collections.OrderedDict((label, []) for label in dict.fromkeys(labels.values()))
    for tool, calls in by_tool.items():
        if tool not in labels or not any(c[0] == "P" and c[1] == SEIZE and c[2] == target for c in calls):
            continue
        label = labels[tool]
        r = fold(calls, switches)
        if r:
            rows[label].append(r)
    rows = collections.OrderedDict((k, v) for k, v in rows.items() if v)
    keys = next(iter(rows.values()))[0].keys() if rows else []
    names = list(rows)
    print("| median of n stops | " + " | ".join(f"{n} ({len(rows[n])})" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for k in keys:
        cells = []
        for n in names:
            known = [r[k] for r in rows[n] if r[k] == r[k]]  # a stop whose switches were lost has NaN
            v = statistics.median(known) if known else float("nan")
            cells.append(f"{v:.0f}" if k in ("threads", "wait4 calls", "sleeps (nanosleep)", "mem writes", "mem reads", "page faults of the tool", "threads not run within 30 ms of their detach") else f"{v:.0f} us")
        print(f"| {k} | " + " | ".join(cells) + " |")


main()
