#!/usr/bin/env python3
"""Summarises a BELUGA_TRACE file (Chrome-trace JSON written by the engine): host time per loop
iteration split by span, the model runner's forward time, how much of the host work ran while a
forward was in flight (hidden behind it), and the gap between one forward's end and the next one's
start on the runner thread (what the device waits for the host between steps: a step launched early
starts right after the one ahead of it), and the mean of the phases inside a speculating forward
(verify forward, verification, MTP pass, chained MTP steps).

usage: scripts/trace_summary.py TRACE.json [--skip-first N]
"""
import bisect
import json
import sys


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    skip = 0
    if "--skip-first" in args:
        i = args.index("--skip-first")
        skip = int(args[i + 1])
        del args[i:i + 2]
    with open(args[0]) as f:
        trace = json.load(f)
    lanes = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    loop = [t for t, n in lanes.items() if n == "engine loop"]
    runner = [t for t, n in lanes.items() if n == "model runner"]
    if not loop or not runner:
        print("no engine loop / model runner lanes in this trace", file=sys.stderr)
        return 1
    iters = sorted((e for e in spans if e["tid"] == loop[0] and e["name"] == "step"), key=lambda e: e["ts"])
    iters = iters[skip:]
    phases = [e for e in spans if e["tid"] == loop[0] and e["name"] != "step"]
    on_runner = [e for e in spans if e["tid"] == runner[0]]
    fwd = sorted((e for e in on_runner if e["name"] == "forward"), key=lambda e: e["ts"])
    inner = [e for e in on_runner if e["name"] != "forward"]  # phases inside a forward (speculation)
    if not iters:
        print("no steps", file=sys.stderr)
        return 1
    t0, t1 = iters[0]["ts"], iters[-1]["ts"] + iters[-1]["dur"]
    phases = [e for e in phases if t0 <= e["ts"] <= t1]
    fwd = [e for e in fwd if t0 <= e["ts"] <= t1]
    fstart = [e["ts"] for e in fwd]

    def hidden(e):  # microseconds of span e that overlap some forward
        a, b = e["ts"], e["ts"] + e["dur"]
        i = max(0, bisect.bisect_right(fstart, a) - 1)
        h = 0.0
        while i < len(fwd) and fwd[i]["ts"] < b:
            fa, fb = fwd[i]["ts"], fwd[i]["ts"] + fwd[i]["dur"]
            h += max(0.0, min(b, fb) - max(a, fa))
            i += 1
        return h

    n = len(iters)
    by = {}
    for e in phases:
        s = by.setdefault(e["name"], [0, 0.0, 0.0])
        s[0] += 1
        s[1] += e["dur"]
        s[2] += hidden(e)
    order = ["admit", "schedule", "build batch (early)", "launch (early)", "wait", "sample",
             "finish early step", "build batch", "launch", "deliver"]
    print(f"{n} loop iterations, {len(fwd)} forwards, {(t1 - t0) / 1e3:.1f} ms")
    print(f"{'span':<12} {'count':>7} {'us/iter':>9} {'share':>7} {'hidden':>7}")
    total = sum(e["dur"] for e in iters)
    host = 0.0
    host_hidden = 0.0
    for name in order + sorted(set(by) - set(order)):
        if name not in by:
            continue
        c, d, h = by[name]
        print(f"{name:<12} {c:>7} {d / n:>9.1f} {100 * d / total:>6.1f}% {100 * h / d if d else 0:>6.1f}%")
        if name != "wait":
            host += d
            host_hidden += h
    fw = sum(e["dur"] for e in fwd)
    print(f"{'step (all)':<12} {n:>7} {total / n:>9.1f}")
    print(f"{'forward':<12} {len(fwd):>7} {fw / max(1, len(fwd)):>9.1f}   (runner thread)")
    for graphed, what in ((1, "graph-replayed"), (0, "eager")):
        d = sorted(e["dur"] for e in fwd if e.get("args", {}).get("graph") == graphed)
        if d:
            tok = [e["args"].get("tokens", 0) for e in fwd if e.get("args", {}).get("graph") == graphed]
            # The share of the runner's forward time: eager forwards are mostly mixed prompt + decode
            # steps, rare but long (c64 demo under desynchronised arrivals: 15 % of steps, 35 % of time).
            print(f"  {what:<22} {len(d):>7} {sum(d) / len(d):>9.1f} us each, p10 {d[len(d) // 10]:.1f}, "
                  f"p50 {d[len(d) // 2]:.1f}; {sum(tok) / len(tok):.1f} batch tokens; "
                  f"{100 * sum(d) / fw if fw else 0:.0f}% of forward time")
    inner = [e for e in inner if t0 <= e["ts"] <= t1]
    for name in sorted({e["name"] for e in inner}):
        d = [e["dur"] for e in inner if e["name"] == name]
        print(f"  {name:<22} {len(d):>7} {sum(d) / len(d):>9.1f} us each")
    print(f"host work (every span but wait): {host / n:.1f} us/iter, {100 * host_hidden / host if host else 0:.1f}% "
          f"of it while a forward ran")
    gaps = sorted(b["ts"] - (a["ts"] + a["dur"]) for a, b in zip(fwd, fwd[1:]))
    if gaps:
        pick = lambda q: gaps[min(len(gaps) - 1, int(q * len(gaps)))]
        print(f"runner gap between forwards: mean {sum(gaps) / len(gaps):.1f} us, p50 {pick(0.5):.1f}, "
              f"p90 {pick(0.9):.1f} ({len(gaps)} gaps; idle periods included)")
        queued = {e["args"]["step"]: e for e in spans if lanes.get(e["tid"]) == "runner queue"
                  and "args" in e and "step" in e["args"]}
        late_engine, late_runner = [], []  # of each gap: the launch after the step ahead ended; the rest
        for a, b in zip(fwd, fwd[1:]):
            q = queued.get(b.get("args", {}).get("step"))
            if q is None:
                continue
            end_a = a["ts"] + a["dur"]
            late_engine.append(max(0.0, q["ts"] - end_a))
            late_runner.append(b["ts"] - max(end_a, q["ts"]))
        if late_engine:
            for what, v in (("launched after the step ahead ended", late_engine),
                            ("the runner's start after both", late_runner)):
                v.sort()
                print(f"  {what}: mean {sum(v) / len(v):.1f} us, p50 {v[len(v) // 2]:.1f}, "
                      f"p90 {v[min(len(v) - 1, int(0.9 * len(v)))]:.1f}")
        early = by.get("launch (early)", [0])[0]
        print(f"steps launched early: {early} of {len(fwd)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
