"""gdsio-like benchmark: ``python -m millrace.bench FILE --sizes 4K,1M --threads 1,4 ...``.

Modes (as gdsio's -x): ``cpu`` reads into aligned host memory (O_DIRECT), ``cpu-gpu`` reads
into a pinned buffer and copies it to GPU memory (bounce), ``gds`` reads with cuFile straight
into GPU memory. Each thread reads its own contiguous region of the file, sequentially (or at
random with --pattern rand), one transfer at a time; latency is per transfer, from the start of
its read until its bytes are on the GPU in cpu-gpu mode. In cpu-gpu mode transfers under
--coalesce bytes (1M) are still read one by one but go to the GPU a batch per copy, overlapped
with the next batch's reads (--coalesce 0: one copy per transfer, waited for, as gdsio). With
fio installed every cell is also run by fio with the same file, block size, job count and
pattern, alternating with ours in the same run, and the ratio is reported: against fio for cpu,
against min(fio, pinned host-to-device rate) for cpu-gpu and gds.

--whole adds whole-file reads (millrace.read to cpu and cuda, the naive
torch.from_numpy(np.fromfile(f)).cuda(), the pinned host-to-device rate, fio on the file) and
--checkpoint-gb N adds a save/load of an N GB state dict against fio writing and reading as
much on the same filesystem.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np

from . import _gpu, _io
from .checkpoint import load_checkpoint, save_checkpoint
from .core import read

# cpu-gpu mode's default batch: a 1 MiB copy takes about 20 us at H100's pinned rate, and amortised
# over 256 4 KiB reads it costs well under 1% of them.
DEFAULT_COALESCE = 1 << 20

COLUMNS = [
    "mode",
    "size_bytes",
    "threads",
    "gbps",
    "lat_p50_us",
    "lat_p99_us",
    "lat_p999_us",
    "iops",
    "cpu_pct",
    "bytes",
    "seconds",
    "baseline",
    "baseline_gbps",
    "ratio",
]


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B").rstrip("I")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if s.endswith(suffix):
            s, mult = s[:-1], m
            break
    try:
        return int(float(s) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size like 4K, 1M or 2G") from None


def _cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def drop_cache(path: str) -> None:
    """Evict the file's clean pages from the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _per_copy(coalesce: int, size: int) -> int:
    """How many transfers of ``size`` bytes one host-to-device copy carries in cpu-gpu mode."""
    return max(1, coalesce // size) if coalesce else 1


def run_cell(
    mode: str,
    path: str,
    size: int,
    threads: int,
    seconds: float,
    pattern: str,
    coalesce: int = DEFAULT_COALESCE,
    workers: str = "threads",
) -> dict:
    """One gdsio-style measurement: ``threads`` workers, transfers of ``size`` bytes.

    ``workers="processes"`` runs each worker in its own process (as fio runs its jobs and
    PyTorch's DataLoader its workers), so small transfers are not serialised on the GIL.
    """
    f = _io.InputFile(path)
    try:
        region = _io.round_down(f.size // threads, max(size, _io.ALIGN))
    finally:
        f.close()
    if region < size:
        raise SystemExit(
            f"{path} ({f.size} bytes) is too small for {threads} workers of {size}-byte "
            "transfers; use a bigger file (--create) or fewer threads."
        )
    job = (mode, path, size, region, pattern, coalesce, seconds)
    run = _run_processes if workers == "processes" else _run_threads
    results, cpu = run(job, threads)
    # Each worker timed its own loop on CLOCK_MONOTONIC, which all processes share.
    wall = (max(r["end"] for r in results) - min(r["start"] for r in results)) / 1e9
    all_lat = np.concatenate([r["lat"] for r in results]) / 1000.0
    count = int(all_lat.size)
    total = count * size
    extra: dict = {}
    if mode != "cpu":
        # what each worker's last copy or cuFile read left in GPU memory is the file's bytes
        extra["verified"] = all(r["verified"] is not False for r in results)
    if mode == "cpu-gpu":
        extra["coalesce"] = _per_copy(coalesce, size)
    if workers == "processes":
        extra["workers"] = "processes"
    return {
        **extra,
        "mode": mode,
        "size_bytes": size,
        "threads": threads,
        "gbps": total / wall / 1e9,
        "lat_p50_us": float(np.percentile(all_lat, 50)),
        "lat_p99_us": float(np.percentile(all_lat, 99)),
        "lat_p999_us": float(np.percentile(all_lat, 99.9)),
        "iops": count / wall,
        "cpu_pct": 100.0 * cpu / wall,
        "bytes": total,
        "seconds": wall,
    }


def _run_threads(job: tuple, threads: int) -> tuple:
    """The workers' results and the CPU seconds the whole process used while they read."""
    barrier = threading.Barrier(threads + 1)
    results: list = [None] * threads
    errors: list = []

    def run(t: int) -> None:
        try:
            results[t] = _cell_worker(job, t, barrier.wait)
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    ths = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait()
    c0 = _cpu_seconds()
    for th in ths:
        th.join()
    cpu = _cpu_seconds() - c0
    if errors:
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    return results, cpu


def _mp_context():
    import multiprocessing

    # forkserver: children fork from a clean server that has already imported NumPy, millrace
    # and torch, but never touched CUDA (forking a process that has is unsafe), so a worker
    # starts in milliseconds instead of re-importing torch.
    ctx = multiprocessing.get_context("forkserver")
    preload = ["numpy", "millrace"]
    if _gpu.torch_module() is not None:
        preload.append("torch")
    ctx.set_forkserver_preload(preload)
    return ctx


def _process_main(job: tuple, t: int, barrier, out) -> None:
    try:
        out.put((t, _cell_worker(job, t, lambda: barrier.wait(120)), None))
    except BaseException as e:
        barrier.abort()
        out.put((t, None, f"{type(e).__name__}: {e}"))


def _run_processes(job: tuple, procs: int) -> tuple:
    """The workers' results and the CPU seconds their processes used while they read."""
    ctx = _mp_context()
    barrier = ctx.Barrier(procs)
    out = ctx.Queue()
    ps = [ctx.Process(target=_process_main, args=(job, t, barrier, out)) for t in range(procs)]
    for p in ps:
        p.start()
    results: list = [None] * procs
    errors = []
    deadline = time.monotonic() + job[6] + 180
    got = 0
    try:
        while got < procs:
            try:
                t, res, err = out.get(timeout=0.5)
            except queue.Empty:
                # a worker killed outright (a signal, the OOM killer) never reports; say so
                # instead of waiting for it
                dead = [i for i, p in enumerate(ps) if p.exitcode not in (None, 0)]
                if dead:
                    i = dead[0]
                    raise RuntimeError(
                        f"bench worker {i} died (exit code {ps[i].exitcode}) before reporting"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError("bench workers did not finish in time") from None
                continue
            got += 1
            results[t] = res
            if err:
                errors.append(f"worker {t}: {err}")
    finally:
        # after a failure the others need not finish their cell
        for p in ps:
            p.join(10 if got == procs else 0)
            if p.is_alive():
                p.kill()
                p.join()
    real = [e for e in errors if "BrokenBarrierError" not in e]
    if errors:
        raise RuntimeError((real or errors)[0])
    return results, sum(r["cpu"] for r in results)


def _cell_worker(job: tuple, t: int, wait) -> dict:
    """Worker ``t``'s part of a cell: set up, ``wait()`` for the others, read for the cell's
    seconds. Returns its per-transfer latencies (ns), loop start/end (CLOCK_MONOTONIC ns), its
    process's CPU seconds meanwhile (the cell's own when the worker is a process), and whether
    the bytes it left in GPU memory are the file's (None for cpu).

    In cpu-gpu mode transfers smaller than ``coalesce`` bytes are read one by one (each its own
    pread of the transfer size) into consecutive slots of a pinned batch, and each full batch
    goes to the GPU in one copy while the worker reads the next batch into the other pinned
    buffer. A copy per 4 KiB transfer costs more CPU (a PyTorch call and a stream sync, under
    the GIL) than the read itself; a batch spreads that cost. ``coalesce=0`` copies every
    transfer on its own and waits for it, as gdsio does.
    """
    mode, path, size, region, pattern, coalesce, seconds = job
    torch = _gpu.torch_module() if mode != "cpu" else None
    f = _io.InputFile(path)
    cf = handle = None
    try:
        fd = f.fd_direct if f.direct else f.fd_buffered
        base = t * region
        nblocks = region // size
        rng = np.random.default_rng(t)
        offs = (
            rng.integers(0, nblocks, size=1 << 16) * size
            if pattern == "rand"
            else (np.arange(1 << 16) % nblocks) * size
        ).tolist()
        if mode == "cpu":
            buf = _io.aligned_empty(size)
        elif mode == "cpu-gpu":
            per = _per_copy(coalesce, size)
            pins = [_gpu.Pinned(per * size) for _ in range(2 if per > 1 else 1)]
            devs = [torch.empty(per * size, dtype=torch.uint8, device="cuda") for _ in pins]
            stream = torch.cuda.Stream()
            torch.cuda.set_stream(stream)
        else:
            cf = _gpu.use_gds(True)
            handle = cf.register(fd)
            dev = torch.empty(size, dtype=torch.uint8, device="cuda")
            ptr = dev.data_ptr()
        if torch is not None:
            torch.cuda.synchronize()
        preadv = os.preadv
        clock = time.perf_counter_ns
        last = None  # (device buffer, file offsets of the transfers it holds)
        lat: list = []
        append = lat.append
        mask = len(offs) - 1
        k = 0
        wait()
        c0 = _cpu_seconds()
        start = t1 = clock()
        end_ns = start + int(seconds * 1e9)
        if mode == "cpu":
            bufs = [memoryview(buf)]
            while t1 < end_ns:
                off = base + offs[k & mask]
                t0 = clock()
                got = preadv(fd, bufs, off)
                t1 = clock()
                append(t1 - t0)
                k += 1
                if got != size:
                    raise OSError(f"short read of {got} bytes at {off}")
        elif mode == "cpu-gpu" and per == 1:
            bufs = [memoryview(pins[0].np)]
            src, dev, sync = pins[0].t, devs[0], stream.synchronize
            while t1 < end_ns:
                off = base + offs[k & mask]
                t0 = clock()
                got = preadv(fd, bufs, off)
                dev.copy_(src, non_blocking=True)
                sync()
                t1 = clock()
                append(t1 - t0)
                k += 1
                if got != size:
                    raise OSError(f"short read of {got} bytes at {off}")
            last = (devs[0], [off])
        elif mode == "cpu-gpu":
            slots = [
                [[memoryview(p.np[i * size : (i + 1) * size])] for i in range(per)] for p in pins
            ]
            Event = torch.cuda.Event
            # The batch in flight: its event, and its transfers' start times. Its transfers'
            # latency ends when the copy is seen done, which is checked after each read of the
            # next batch (so it is late by at most one read).
            pending = None

            def landed(batch) -> None:
                done = clock()
                lat.extend(done - s for s in batch[1])

            starts: list = []
            batch_offs: list = []
            h = i = 0
            while t1 < end_ns or i:
                off = base + offs[k & mask]
                t0 = clock()
                got = preadv(fd, slots[h][i], off)
                t1 = clock()
                if got != size:
                    raise OSError(f"short read of {got} bytes at {off}")
                if pending is not None and pending[0].query():
                    landed(pending)
                    pending = None
                starts.append(t0)
                batch_offs.append(off)
                k += 1
                i += 1
                if i == per or (t1 >= end_ns and i):
                    if pending is not None:
                        # the other pinned buffer is refilled next: its copy must be over
                        pending[0].synchronize()
                        landed(pending)
                    devs[h][: i * size].copy_(pins[h].t[: i * size], non_blocking=True)
                    ev = Event()
                    ev.record(stream)
                    pending = (ev, starts)
                    last = (devs[h], batch_offs)
                    starts, batch_offs = [], []
                    h ^= 1
                    i = 0
                    t1 = clock()
            if pending is not None:
                pending[0].synchronize()
                landed(pending)
        else:
            read_ = cf.read
            while t1 < end_ns:
                off = base + offs[k & mask]
                t0 = clock()
                got = read_(handle, ptr, size, off, 0)
                t1 = clock()
                append(t1 - t0)
                k += 1
                if got != size:
                    raise OSError(f"short read of {got} bytes at {off}")
            last = (dev, [off])
        end = clock()
        cpu = _cpu_seconds() - c0
        verified = None if mode == "cpu" else last is not None and _holds(f, size, *last)
        return {
            "lat": np.array(lat, dtype=np.int64),
            "start": start,
            "end": end,
            "cpu": cpu,
            "verified": verified,
        }
    finally:
        if handle is not None:
            cf.deregister(handle)
        f.close()


def _holds(f: _io.InputFile, size: int, dev, offs: list) -> bool:
    got = dev[: len(offs) * size].cpu().numpy().tobytes()
    return got == b"".join(os.pread(f.fd_buffered, size, o) for o in offs)


def fio_cell(path: str, size: int, threads: int, seconds: float, pattern: str) -> Optional[dict]:
    fio = shutil.which("fio")
    if fio is None:
        return None
    fsize = os.path.getsize(path)
    region = _io.round_down(fsize // threads, max(size, _io.ALIGN))
    cmd = [
        fio,
        "--name=millrace-bench",
        f"--filename={path}",
        "--readonly",
        f"--rw={'randread' if pattern == 'rand' else 'read'}",
        f"--bs={size}",
        f"--numjobs={threads}",
        f"--size={region}",
        f"--offset_increment={region}",
        "--direct=1",
        "--ioengine=psync",
        "--time_based",
        f"--runtime={max(1, round(seconds))}",
        "--group_reporting",
        "--output-format=json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"fio failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]["read"]
    pct = job.get("clat_ns", {}).get("percentile", {})
    return {
        "mode": "fio",
        "size_bytes": size,
        "threads": threads,
        "gbps": job["bw_bytes"] / 1e9,
        "lat_p50_us": pct.get("50.000000", 0) / 1000,
        "lat_p99_us": pct.get("99.000000", 0) / 1000,
        "lat_p999_us": pct.get("99.900000", 0) / 1000,
        "iops": job["iops"],
        "cpu_pct": "",
        "bytes": job["io_bytes"],
        "seconds": job["runtime"] / 1000,
    }


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


def _row(mode, size, threads, nbytes, secs, baseline="", base_rate=None, **extra) -> dict:
    rate = nbytes / secs
    return {
        "mode": mode,
        "size_bytes": size,
        "threads": threads,
        "gbps": rate / 1e9,
        "bytes": nbytes,
        "seconds": secs,
        "baseline": baseline,
        "baseline_gbps": "" if base_rate is None else base_rate / 1e9,
        "ratio": "" if base_rate is None else rate / base_rate,
        **extra,
    }


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
        variants["whole-cpu-gpu"] = on_gpu(lambda: read(path, "cuda", threads=threads, gds=False))
        if not _gds_usable(path):
            variants["whole-gds"] = on_gpu(lambda: read(path, "cuda", threads=threads, gds=True))
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


def make_plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [r for r in rows if r["mode"] in ("cpu", "cpu-gpu", "gds", "fio")]
    modes = [m for m in ("cpu", "cpu-gpu", "gds") if any(r["mode"] == m for r in grid)]
    if not modes:
        return
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for th in sorted({r["threads"] for r in grid}):
            for m, style in ((mode, "-o"), ("fio", "--x")):
                pts = sorted(
                    (r["size_bytes"], r["gbps"])
                    for r in grid
                    if r["mode"] == m and r["threads"] == th
                )
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=f"{m} {th} thr")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("transfer size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(mode)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _median_row(rows: list) -> dict:
    """The run with the median throughput (the lower middle one for an even count)."""
    return sorted(rows, key=lambda r: r["gbps"])[(len(rows) - 1) // 2]


def _gds_usable(path: str) -> str:
    """Empty if cuFile can read ``path``, else why not."""
    cf = _gpu.CuFile.get()
    if cf is None:
        return _gpu.CuFile.why_not()
    f = _io.InputFile(path)
    try:
        cf.deregister(cf.register(f.fd_direct if f.direct else f.fd_buffered))
    except Exception as e:
        return str(e)
    finally:
        f.close()
    return ""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m millrace.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="file to read (created with --create SIZE if missing)")
    p.add_argument("--sizes", default="4K,64K,1M,16M")
    p.add_argument("--threads", default="1,4,16")
    p.add_argument("--mode", default="cpu,cpu-gpu,gds")
    p.add_argument("--seconds", type=float, default=2.0, help="per cell")
    p.add_argument("--pattern", choices=["seq", "rand"], default="seq")
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.add_argument(
        "--fio",
        choices=["auto", "no"],
        default="auto",
        help="compare cpu cells with fio in the same run (default when installed)",
    )
    p.add_argument("--create", type=parse_size, help="write FILE with this many random bytes")
    p.add_argument("--whole", action="store_true", help="also time whole-file reads")
    p.add_argument("--whole-threads", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="runs of each whole-file/checkpoint test")
    p.add_argument(
        "--cell-repeat",
        type=int,
        default=1,
        help="runs of each cell (alternating with fio); the median is reported",
    )
    p.add_argument("--checkpoint-gb", type=float, help="also save/load a state dict this big")
    p.add_argument(
        "--workers",
        choices=["threads", "processes"],
        default="threads",
        help="run each cell's workers as threads of this process (default) or as processes, "
        "as fio runs its jobs and DataLoader its workers; processes keep 4K transfers off the GIL",
    )
    p.add_argument(
        "--coalesce",
        type=parse_size,
        default=DEFAULT_COALESCE,
        help="cpu-gpu mode: smaller transfers are read one by one into a pinned batch of this "
        "many bytes, copied to the GPU as one while the next batch is read (default 1M; "
        "0 copies and waits for each transfer on its own, as gdsio does)",
    )
    args = p.parse_args(argv)

    print(_gpu.describe(), flush=True)
    if args.create and not os.path.exists(args.file):
        chunk = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8)
        with open(args.file, "wb") as fh:
            left = args.create
            while left > 0:
                fh.write(chunk[: min(left, chunk.size)].tobytes())
                left -= chunk.size
            os.fsync(fh.fileno())
    _io.check_path(args.file)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    torch = _gpu.torch_module()
    gpu = torch is not None and torch.cuda.is_available()
    for m in list(modes):
        if m not in ("cpu", "cpu-gpu", "gds"):
            raise SystemExit(f"unknown mode {m!r}; use cpu, cpu-gpu or gds.")
        if m != "cpu" and not gpu:
            print(f"skipping mode {m}: no CUDA device (PyTorch with CUDA is needed)")
            modes.remove(m)
        elif m == "gds":
            why = _gds_usable(args.file)
            if why:
                print(f"skipping mode gds: {why}")
                modes.remove(m)
    use_fio = args.fio == "auto" and shutil.which("fio") is not None
    if "cpu" in modes and not use_fio:
        print("fio comparison: off (" + ("--fio no" if args.fio == "no" else "fio not found") + ")")
    needs_h2d = gpu and (args.whole or any(m != "cpu" for m in modes))
    h2d = _gpu.h2d_rate(1 << 30) if needs_h2d else None
    if h2d:
        print(f"pinned host-to-device rate: {h2d / 1e9:.1f} GB/s", flush=True)
    rows = []
    hdr = f"{'mode':>10} {'size':>9} {'thr':>4} {'GB/s':>8} {'p50 us':>9} {'p99 us':>9} {'cpu%':>6}"
    print(hdr)
    for size in sizes:
        for th in threads:
            ours: dict = {m: [] for m in modes}
            theirs = []
            for _ in range(args.cell_repeat):
                # every mode and fio take turns, so drift in the disk's rate hits all alike
                for mode in modes:
                    ours[mode].append(
                        run_cell(
                            mode,
                            args.file,
                            size,
                            th,
                            args.seconds,
                            args.pattern,
                            args.coalesce,
                            args.workers,
                        )
                    )
                if use_fio and modes:
                    got = fio_cell(args.file, size, th, args.seconds, args.pattern)
                    if got:
                        theirs.append(got)
            fr = _median_row(theirs) if theirs else None
            if fr:
                rows.append(fr)
            for mode in modes:
                r = _median_row(ours[mode])
                if fr:
                    # the GPU modes' bound is the slower of the file and the host-to-device path
                    base, name = fr["gbps"], "fio"
                    if mode != "cpu" and h2d:
                        base, name = min(base, h2d / 1e9), "min(fio,h2d)"
                    r.update(baseline=name, baseline_gbps=base, ratio=r["gbps"] / base)
                rows.append(r)
                extra = f"  {r['ratio']:.2f}x {r['baseline']}" if r.get("ratio") else ""
                print(
                    f"{mode:>10} {size:>9} {th:>4} {r['gbps']:8.3f} {r['lat_p50_us']:9.1f} "
                    f"{r['lat_p99_us']:9.1f} {r['cpu_pct']:6.0f}{extra}",
                    flush=True,
                )
    if args.whole:
        for r in whole_file(args.file, args.whole_threads, args.repeat, h2d):
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.checkpoint_gb:
        for r in checkpoint_bench(
            os.path.dirname(os.path.abspath(args.file)),
            args.checkpoint_gb,
            args.whole_threads,
            args.repeat,
        ):
            rows.append(r)
            print(json.dumps(r), flush=True)
    if args.csv:
        extra_cols = sorted({k for r in rows for k in r} - set(COLUMNS))
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS + extra_cols, restval="")
            w.writeheader()
            for r in rows:
                w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    if args.plot:
        make_plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
