#!/usr/bin/env python3
"""Splits an ncu raw CSV of a decoding server's kernels (bench/ncu_spec.sh) into forwards: a segment
ends at each argmax kernel (a verify or plain forward's end, or an MTP pass's). Prints every segment's
kernel count and summed duration, then the kernels of the first `--show` complete segments from the
first full-size one on (a speculating step: the verify forward, then its MTP passes).
usage: bench/ncu_spec_steps.py FILE.csv [--show 4]"""
import argparse
import csv
import re


def kernels(path):
    rows = list(csv.reader(open(path)))
    hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    h = rows[hdr]
    name, dur, grid = h.index("Kernel Name"), h.index("gpu__time_duration.sum"), h.index("Grid Size")
    unit = rows[hdr + 1][dur]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[unit]
    for r in rows[hdr + 2:]:
        if len(r) == len(h):
            yield float(r[dur].replace(",", "")) * scale, short(r[name]), r[grid]


def short(n):
    n = re.sub(r"\(.*", "", n)
    for p in ("void ", "beluga::<unnamed>::", "cuda::<unnamed>::"):
        n = n.replace(p, "")
    return n[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--show", type=int, default=4)
    a = ap.parse_args()
    segs, cur = [], []
    for k in kernels(a.csv):
        cur.append(k)
        if "argmax" in k[1]:
            segs.append(cur)
            cur = []
    segs = segs[1:]  # the first one starts mid-forward
    for i, s in enumerate(segs):
        print(f"segment {i}: {len(s)} kernels, {sum(t for t, _, _ in s):.1f} us (first grid {s[0][2]})")
    if not segs:
        return
    big = max(len(s) for s in segs)
    first = next(i for i, s in enumerate(segs) if len(s) == big)
    for i in range(first, min(len(segs), first + a.show)):
        print(f"\n== segment {i}: {sum(t for t, _, _ in segs[i]):.1f} us")
        for t, n, g in segs[i]:
            print(f"{t:8.2f} us {g:>14} {n}")


if __name__ == "__main__":
    main()
