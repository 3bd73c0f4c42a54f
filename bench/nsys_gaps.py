"""Kernel durations and the idle gaps before them in a CUDA-graph decode step, from
`nsys stats --report cuda_gpu_trace --format csv` of a run with `--cuda-graph-trace=node`.
Usage: python3 nsys_gaps.py TRACE.csv FIRST_KERNEL_SUBSTRING [STEPS]
The step starts at each kernel whose name contains FIRST_KERNEL_SUBSTRING; the last STEPS steps
(default 5) are averaged."""
import collections, csv, sys

rows = list(csv.DictReader(open(sys.argv[1])))
first, steps = sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5
k = [r for r in rows if r.get("Name") and "[CUDA memcpy" not in r["Name"] and "[CUDA memset" not in r["Name"]]
start_col = "Start (ns)" if "Start (ns)" in k[0] else "Start"
dur_col = "Duration (ns)" if "Duration (ns)" in k[0] else "Duration"
ev = [(int(float(r[start_col])), int(float(r[dur_col])), r["Name"]) for r in k]
ev.sort()
heads = [i for i, e in enumerate(ev) if first in e[2]]
if len(heads) < steps + 1:
    sys.exit(f"only {len(heads)} steps found")
agg = collections.OrderedDict()
tot_k = tot_g = tot_step = 0.0
n_k = 0
for s in range(len(heads) - steps - 1, len(heads) - 1):
    a, b = heads[s], heads[s + 1]
    tot_step += (ev[b][0] - ev[a][0]) / 1e3
    for i in range(a, b):
        gap = (ev[i][0] - (ev[i - 1][0] + ev[i - 1][1])) / 1e3 if i > a else 0.0
        name = ev[i][2][:60]
        d = agg.setdefault(name, [0, 0.0, 0.0])
        d[0] += 1; d[1] += ev[i][1] / 1e3; d[2] += gap
        tot_k += ev[i][1] / 1e3; tot_g += gap; n_k += 1
print(f"{steps} steps: step {tot_step/steps:.1f} us, kernels {tot_k/steps:.1f} us, gaps {tot_g/steps:.1f} us, "
      f"{n_k/steps:.0f} kernels/step, {tot_g/max(n_k,1):.2f} us/gap")
print(f"{'kernel':60s} {'n/step':>6s} {'us each':>8s} {'gap before':>10s}")
for name, (n, d, g) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"{name:60s} {n/steps:6.0f} {d/n:8.2f} {g/n:10.2f}")
