"""Checkpoint save variants against fio write, interleaved (run on the GPU machine)."""

import os
import statistics
import time

import torch

from millrace import _io, bench, save_checkpoint

D = "/tmp/mb"
os.makedirs(D, exist_ok=True)
n = (64 << 20) // 2
state = {f"l{i:03d}": torch.randn(n, device="cuda").to(torch.bfloat16) for i in range(64)}
host = {k: v.cpu().view(torch.int16).numpy() for k, v in state.items()}
nbytes = 64 * (64 << 20)
path, fp = f"{D}/c.safetensors", f"{D}/fio.tmp"
variants = [
    ("gpu fallocate t8 c8M", state, True, 8, 8 << 20),
    ("gpu ftruncate t8 c8M", state, False, 8, 8 << 20),
    ("gpu fallocate t16 c16M", state, True, 16, 16 << 20),
    ("gpu ftruncate t16 c16M", state, False, 16, 16 << 20),
    ("host fallocate t8 c8M", host, True, 8, 8 << 20),
    ("gpu ftruncate t8 c32M", state, False, 8, 32 << 20),
]
res = {v[0]: [] for v in variants}
fio = []
for _rnd in range(2):
    for name, sd, pre, th, ch in variants:
        fio.append(bench.fio_whole(fp, "write", nbytes, 8, 8 << 20))
        os.unlink(fp)
        _io.PREALLOCATE = pre
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        save_checkpoint(sd, path, threads=th, chunk=ch)
        res[name].append(nbytes / (time.perf_counter() - t0))
        os.unlink(path)
f = statistics.median(fio)
runs = " ".join(f"{x / 1e9:.2f}" for x in fio)
print(f"fio write median {f / 1e9:.3f} GB/s (all: {runs})")
for k, v in res.items():
    m = statistics.median(v)
    runs = " ".join(f"{x / 1e9:.2f}" for x in v)
    print(f"{k:<26} {m / 1e9:.3f} GB/s  ratio {m / f:.2f}  runs {runs}")
