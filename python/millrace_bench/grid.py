"""The gdsio-style grid: one cell is ``threads`` workers reading transfers of one size for a
few seconds, in one of the modes cpu, cpu-gpu and gds, and fio's run of the same cell."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np

from millrace import _gpu, _io

from .common import DEFAULT_COALESCE, _cpu_seconds


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
    preload = ["numpy", "millrace", "millrace_bench.grid"]
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
    registered: list = []  # callables that undo the set-up (close KvikIO's handle)
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
        loop = _reader(mode, torch, fd, size, coalesce, registered, path)
        if torch is not None:
            torch.cuda.synchronize()
        wait()
        c0 = _cpu_seconds()
        start = time.perf_counter_ns()
        lat, last = loop(base, offs, start, start + int(seconds * 1e9))
        end = time.perf_counter_ns()
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
        for undo in registered:
            undo()
        f.close()


def _reader(mode: str, torch, fd: int, size: int, coalesce: int, registered: list, path: str):
    """Sets up one mode's buffers (before the timed part) and returns its read loop:
    ``loop(base, offs, t1, end_ns) -> (latencies, last)``, where ``last`` is the device buffer
    and the file offsets of the transfers it holds (None in cpu mode)."""
    if mode == "cpu":
        return functools.partial(_loop_cpu, fd, size, _io.aligned_empty(size))
    if mode == "cpu-gpu":
        per = _per_copy(coalesce, size)
        pins = [_gpu.Pinned(per * size) for _ in range(2 if per > 1 else 1)]
        devs = [torch.empty(per * size, dtype=torch.uint8, device="cuda") for _ in pins]
        stream = torch.cuda.Stream()
        torch.cuda.set_stream(stream)
        if per == 1:
            return functools.partial(_loop_copy_each, fd, size, pins[0], devs[0], stream)
        return functools.partial(_loop_batched, torch, fd, size, per, pins, devs, stream)
    from millrace import _kvikio

    route = "gds" if _kvikio.gds_available() else "cufile-compat"
    ctx = _kvikio.opened(path, "r", route)
    handle = ctx.__enter__()
    registered.append(lambda: ctx.__exit__(None, None, None))
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    _kvikio.register_once(dev)
    return functools.partial(_loop_gds, handle.raw_read, dev, size)


def _loop_cpu(fd, size, buf, base, offs, t1, end_ns):
    """cpu: each transfer read into one aligned buffer."""
    preadv, clock = os.preadv, time.perf_counter_ns
    lat: list = []
    append = lat.append
    mask = len(offs) - 1
    k = 0
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
    return lat, None


def _loop_copy_each(fd, size, pin, dev, stream, base, offs, t1, end_ns):
    """cpu-gpu without coalescing: each transfer read into pinned memory, copied to the GPU,
    and waited for."""
    preadv, clock = os.preadv, time.perf_counter_ns
    lat: list = []
    append = lat.append
    mask = len(offs) - 1
    k = 0
    bufs = [memoryview(pin.np)]
    src, sync = pin.t, stream.synchronize
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
    return lat, (dev, [off])


def _loop_batched(torch, fd, size, per, pins, devs, stream, base, offs, t1, end_ns):
    """cpu-gpu with coalescing: ``per`` transfers read into one pinned buffer, copied to the
    GPU in one copy while the next batch is read into the other."""
    preadv, clock = os.preadv, time.perf_counter_ns
    lat: list = []
    mask = len(offs) - 1
    k = 0
    last = None
    slots = [[[memoryview(p.np[i * size : (i + 1) * size])] for i in range(per)] for p in pins]
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
    return lat, last


def _loop_gds(read_, dev, size, base, offs, t1, end_ns):
    """gds: each transfer read by cuFile (KvikIO's raw_read: one cuFileRead, no thread pool)
    straight into GPU memory."""
    clock = time.perf_counter_ns
    lat: list = []
    append = lat.append
    mask = len(offs) - 1
    k = 0
    while t1 < end_ns:
        off = base + offs[k & mask]
        t0 = clock()
        got = read_(dev, size, off, 0)
        t1 = clock()
        append(t1 - t0)
        k += 1
        if got != size:
            raise OSError(f"short read of {got} bytes at {off}")
    return lat, (dev, [off])


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
