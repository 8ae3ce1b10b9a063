# Stop 12 probe, run on the GPU machine from the repository root:
#   python3 docs/results/python/pinned_probe.py FILE      (FILE: 1 GiB or more)
# Times 4 KiB O_DIRECT reads into one slot or cycling slots of ordinary and pinned buffers, then
# the bench cell with each copy strategy. Output of the stop 12 run: h100-probe.txt.
import os
import sys
import time

import torch

sys.path.insert(0, "python")
from millrace import _gpu, _io, bench

path = sys.argv[1]
torch.zeros(1, device="cuda")
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)


def cyc(name, arr, size=4096, n=4000, step=True):
    per = arr.nbytes // size
    mvs = [[memoryview(arr[i * size : (i + 1) * size])] for i in range(per)]
    t0 = time.perf_counter()
    for k in range(n):
        os.preadv(fd, mvs[k % per if step else 0], (k * size) % (512 << 20))
    dt = time.perf_counter() - t0
    print(f"{name:40s} {1e6 * dt / n:7.1f} us/read", flush=True)


for _ in range(2):
    cyc("numpy 1M, same slot", _io.aligned_empty(1 << 20), step=False)
    cyc("numpy 1M, cycling slots", _io.aligned_empty(1 << 20))
    cyc("pinned 1M, same slot", _gpu.Pinned(1 << 20).np, step=False)
    cyc("pinned 1M, cycling slots", _gpu.Pinned(1 << 20).np)
for size in (4096, 65536):
    for _ in range(2):
        for mode, co in (("cpu", 0), ("cpu-gpu", 1 << 20), ("cpu-gpu", 0)):
            r = bench.run_cell(mode, path, size, 1, 1.0, "seq", co)
            print(
                f"run_cell {mode:8s} coalesce {co:8d} size {size}: {r['gbps']:.3f} GB/s "
                f"p50 {r['lat_p50_us']:.0f} us  cpu {r['cpu_pct']:.0f}%",
                flush=True,
            )
