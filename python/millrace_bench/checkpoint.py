"""A safetensors checkpoint saved and loaded against fio (or dd) writing and reading as much."""

from __future__ import annotations

import os
import shutil
import statistics
import time

import numpy as np

from millrace import _gpu
from millrace.checkpoint import load_checkpoint, save_checkpoint

from .common import _row, drop_cache
from .whole_file import dd_whole, fio_whole


def checkpoint_bench(directory: str, gb: float, threads: int, repeat: int = 1) -> list:
    torch = _gpu.torch_module()
    gpu = torch is not None and torch.cuda.is_available()
    total = int(gb * (1 << 30))
    piece = 64 << 20
    state: dict = {}
    rng = np.random.default_rng(0)
    for i in range(max(1, total // piece)):
        n = piece // 2
        if gpu:
            state[f"layer{i:04d}.weight"] = torch.randn(n, device="cuda").to(torch.bfloat16)
        else:
            state[f"layer{i:04d}.weight"] = rng.integers(0, 1 << 16, n, dtype=np.uint16).view(
                np.float16
            )
    nbytes = sum(int(v.nbytes) for v in state.values())
    path = os.path.join(directory, "millrace-bench-ckpt.safetensors")
    fio_path = os.path.join(directory, "millrace-bench-fio.tmp")
    bs = 8 << 20
    rows = []
    tool = "fio" if shutil.which("fio") else "dd"
    w_rates, r_rates, saves, loads = [], [], [], []
    for _ in range(repeat):
        w = r = None
        if tool == "fio":
            w = fio_whole(fio_path, "write", nbytes, threads, bs)
            if w:
                drop_cache(fio_path)
                r = fio_whole(fio_path, "read", nbytes, threads, bs)
        if w and r:
            w_rates.append(w)
            r_rates.append(r)
        else:
            tool = "dd"
            w_rates.append(dd_whole(fio_path, "write", nbytes, bs))
            drop_cache(fio_path)
            r_rates.append(dd_whole(fio_path, "read", nbytes, bs))
        os.unlink(fio_path)
        if gpu:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        size = save_checkpoint(state, path, threads=threads)
        saves.append(time.perf_counter() - t0)
        drop_cache(path)
        t0 = time.perf_counter()
        loaded = load_checkpoint(path, device="cuda" if gpu else "cpu", threads=threads)
        if gpu:
            torch.cuda.synchronize()
        loads.append(time.perf_counter() - t0)
    med = statistics.median
    w_rate, r_rate = med(w_rates), med(r_rates)
    rows.append(
        _row(
            "ckpt-save",
            size,
            threads,
            size,
            med(saves),
            f"{tool}-write",
            w_rate,
            source="cuda" if gpu else "numpy",
            runs=repeat,
        )
    )
    t_load = med(loads)
    k = next(iter(state))
    same = (
        bool(torch.equal(loaded[k], state[k]))
        if gpu
        else bool(np.array_equal(loaded[k].view(np.uint16), state[k].view(np.uint16)))
    )
    rows.append(
        _row("ckpt-load", size, threads, size, t_load, f"{tool}-read", r_rate, verified=same)
    )
    os.unlink(path)
    return rows
