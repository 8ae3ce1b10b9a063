"""Whole-file reads (ours to cpu and cuda, the naive NumPy and PyTorch ways, the pinned
host-to-device rate) against fio, and the fio/dd whole-file baselines the checkpoint test uses."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Optional

import numpy as np

from millrace import _gpu, _io
from millrace.core import read

from .common import _row, drop_cache, gds_usable


def fio_whole(path: str, rw: str, size: int, threads: int, bs: int) -> Optional[float]:
    """fio's rate (bytes/s) writing (with a final fsync) or reading ``size`` bytes of ``path``."""
    fio = shutil.which("fio")
    if fio is None:
        return None
    per = _io.round_down(size // threads, bs)
    cmd = [
        fio,
        "--name=millrace-whole",
        f"--filename={path}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--numjobs={threads}",
        f"--size={per}",
        f"--offset_increment={per}",
        "--direct=1",
        "--ioengine=psync",
        "--group_reporting",
        "--output-format=json",
    ]
    if rw == "write":
        cmd += ["--end_fsync=1", "--fallocate=none"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        print(f"fio failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0][
        "write" if rw == "write" else "read"
    ]
    # bw_bytes excludes the final fsync; take the slower of that and bytes over fio's wall time
    # so the comparison with our (fsynced) save is fair to fio, not flattering to us.
    return min(job["bw_bytes"], job["io_bytes"] / wall) if rw == "write" else job["bw_bytes"]


def dd_whole(path: str, rw: str, size: int, bs: int) -> Optional[float]:
    """Fallback baseline where fio is absent: one dd stream with O_DIRECT (and fsync)."""
    dd = shutil.which("dd")
    if dd is None:
        return None
    count = size // bs
    if rw == "write":
        cmd = [
            dd,
            "if=/dev/zero",
            f"of={path}",
            f"bs={bs}",
            f"count={count}",
            "oflag=direct",
            "conv=fsync",
        ]
    else:
        cmd = [dd, f"if={path}", "of=/dev/null", f"bs={bs}", f"count={count}", "iflag=direct"]
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=True)
    return count * bs / (time.perf_counter() - t0)


def whole_file(path: str, threads: int, repeat: int, h2d: Optional[float] = None) -> list:
    """Whole-file reads: ours (cpu, cpu-gpu, gds), naive, fio, and the H2D rate.

    Each repeat runs every variant once, one after another, and the medians are reported, so
    the disk's drift over a run touches all of them alike. ``h2d``: the pinned host-to-device
    rate (bytes/s) if already measured.
    """
    torch = _gpu.torch_module()
    size = os.path.getsize(path)
    gpu = torch is not None and torch.cuda.is_available()
    n = min(size, 1 << 30)
    if gpu and h2d is None:
        h2d = _gpu.h2d_rate(n)

    def on_gpu(fn):
        def run():
            x = fn()
            torch.cuda.synchronize()
            return x

        return run

    variants = {
        "whole-cpu": lambda: read(path, "cpu", threads=threads),
        "whole-naive-numpy": lambda: np.fromfile(path, dtype=np.uint8),
    }
    if gpu:
        variants["whole-naive-torch"] = on_gpu(
            lambda: torch.from_numpy(np.fromfile(path, dtype=np.uint8)).cuda()
        )
        variants["whole-cpu-gpu"] = on_gpu(lambda: read(path, "cuda", threads=threads, via="cpu"))
        if not gds_usable(path):
            variants["whole-gds"] = on_gpu(
                lambda: read(path, "cuda", threads=threads, via="cufile")
            )
    times: dict = {k: [] for k in variants}
    fio_rates = []
    verified = {}
    head = np.fromfile(path, np.uint8, 1 << 20)
    for _ in range(repeat):
        got = fio_whole(path, "read", size, threads, _io.DEFAULT_CHUNK)
        if got:
            fio_rates.append(got)
        for name, fn in variants.items():
            drop_cache(path)
            t0 = time.perf_counter()
            x = fn()
            times[name].append(time.perf_counter() - t0)
            first = x[: 1 << 20]
            verified[name] = bool(
                np.array_equal(first.cpu().numpy() if hasattr(first, "cpu") else first, head)
            )
            del x, first
    med = {k: statistics.median(v) for k, v in times.items()}
    fio_rate = statistics.median(fio_rates) if fio_rates else None
    file_rate = size / med["whole-cpu"]
    rows = [
        _row(
            "whole-cpu",
            size,
            threads,
            size,
            med["whole-cpu"],
            "fio" if fio_rate else "",
            fio_rate,
            verified=verified["whole-cpu"],
        ),
        _row("whole-naive-numpy", size, 1, size, med["whole-naive-numpy"], "whole-cpu", file_rate),
    ]
    if not gpu:
        return rows
    rows.append(_row("h2d-pinned", n, 1, n, n / h2d))
    # The file's read rate is fio's where fio ran (independent of us), else our cpu read's.
    ref = min(fio_rate or file_rate, h2d)
    t_naive = med["whole-naive-torch"]
    rows.append(_row("whole-naive-torch", size, 1, size, t_naive, "min(file,h2d)", ref))
    for name in ("whole-cpu-gpu", "whole-gds"):
        if name in med:
            rows.append(
                _row(
                    name,
                    size,
                    threads,
                    size,
                    med[name],
                    "min(file,h2d)",
                    ref,
                    speedup_vs_naive=t_naive / med[name],
                    verified=verified[name],
                )
            )
    return rows
