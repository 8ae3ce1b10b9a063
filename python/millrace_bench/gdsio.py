"""``millrace-bench gds``: gdsio's flags and gdsio's result line, over millrace's paths.

    millrace-bench gds -f /data/file -d 0 -w 8 -s 1G -i 1M -x 0 -I 0 -T 10 [-V]
        [--fio] [--h2d] [--csv out.csv] [--plot out.png]

-x 0 GPU_DIRECT: KvikIO's cuFile handle (``raw_read``/``raw_write``, one cuFile call per I/O,
no thread pool) on a registered GPU buffer; the path it ran (gds or cufile-compat, from
KvikIO's answers, or kvikio-posix when forced with MILLRACE_GPU_PATH) is printed before the
line. -x 1 CPU_ONLY: an aligned host buffer, pread/pwrite with O_DIRECT where the filesystem
takes it (as gdsio and fio). -x 2 CPU_GPU: the same into pinned memory, then a copy to the GPU
(for writes from it), waited for, per I/O. -x, -i and -w take comma lists (every combination
is run, a line each). With -f the threads split the file (-s is its size); with -D each
thread has its own file DIR/gdsio.N of -s bytes. Without -T every thread does its share once.

Each result line is gdsio's:
IoType: READ XferType: GPUD Threads: 8 DataSetSize: 1048576/1048576(KiB) IOSize: 1024(KiB)
Throughput: 1.234567 GiB/sec, Avg_Latency: 123.456789 usecs ops: 1024 total_time 0.812345 secs
(one line). --fio runs fio with the same file, I/O type, size and job count right after each
line and prints the ratio; --h2d prints the pinned host-to-device copy rate (the ceiling of
CPU_GPU; needs a GPU).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

import numpy as np

from millrace import _gpu, _io, _kvikio

from .common import parse_size

XFER = {0: "GPUD", 1: "CPUONLY", 2: "CPU_GPU"}
IOTYPE = {0: "READ", 1: "WRITE", 2: "RANDREAD", 3: "RANDWRITE"}
FIO_RW = {0: "read", 1: "write", 2: "randread", 3: "randwrite"}
# gdsio's line, for the tests and for anyone parsing this output
LINE_RE = (
    r"^IoType: (?P<io>READ|WRITE|RANDREAD|RANDWRITE) XferType: (?P<xfer>\w+) "
    r"Threads: (?P<threads>\d+) DataSetSize: (?P<done>\d+)/(?P<total>\d+)\(KiB\) "
    r"IOSize: (?P<iosize>\d+)\(KiB\) Throughput: (?P<gibps>[\d.]+) GiB/sec, "
    r"Avg_Latency: (?P<lat>[\d.]+) usecs ops: (?P<ops>\d+) total_time (?P<secs>[\d.]+) secs$"
)
_SEED = np.uint64(0x9E3779B97F4A7C15)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="millrace-bench gds",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-f", dest="file", help="file (threads split it)")
    where.add_argument("-D", dest="dir", help="directory: one file gdsio.N per thread")
    p.add_argument("-d", dest="gpu", type=int, default=0, help="GPU index")
    p.add_argument("-w", dest="threads", default="1", help="threads (comma list)")
    p.add_argument("-s", dest="size", type=parse_size, help="file size (-f) or per-thread (-D)")
    p.add_argument("-i", dest="io_size", default="1M", help="I/O size (comma list)")
    p.add_argument(
        "-x",
        dest="xfer",
        default="0",
        help="0 GPU_DIRECT, 1 CPU_ONLY, 2 CPU_GPU (comma list)",
    )
    p.add_argument(
        "-I",
        dest="io_type",
        type=int,
        choices=sorted(IOTYPE),
        default=0,
        help="0 read, 1 write, 2 randread, 3 randwrite",
    )
    p.add_argument("-T", dest="seconds", type=float, help="run this many seconds")
    p.add_argument("-V", dest="verify", action="store_true", help="verify the data")
    p.add_argument("--fio", action="store_true", help="fio on the same file after each line")
    p.add_argument("--h2d", action="store_true", help="pinned host-to-device copy rate")
    p.add_argument("--csv")
    p.add_argument("--plot")
    return p


def pattern(off: int, n: int) -> np.ndarray:
    """The bytes [off, off+n) of the bench's data: each 8-byte word is its index mixed with a
    constant, so a transfer landing at the wrong offset does not verify."""
    first = off // 8
    words = (np.arange(first, first + (off % 8 + n + 7) // 8, dtype=np.uint64) + 1) * _SEED
    return words.view(np.uint8)[off % 8 : off % 8 + n]


def _open(path: str, write: bool, io_size: int) -> tuple:
    """(fd, direct) with O_DIRECT where the filesystem and the I/O size allow it."""
    flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
    if io_size % _io.ALIGN == 0 and getattr(os, "O_DIRECT", 0):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


def _fill(path: str, size: int, force: bool = False) -> None:
    """Make ``path`` hold the bench's pattern over ``size`` bytes (unless its first 4 KiB
    already do and not ``force``)."""
    if not force and os.path.exists(path) and os.path.getsize(path) >= size:
        head = np.fromfile(path, dtype=np.uint8, count=min(size, 4096))
        if np.array_equal(head, pattern(0, head.size)):
            return
    with open(path, "wb") as fh:
        step = 16 << 20
        for off in range(0, size, step):
            fh.write(pattern(off, min(step, size - off)).tobytes())
        os.fsync(fh.fileno())


def _gpu_ready(index: int):
    torch = _gpu.torch_module()
    if torch is None or not torch.cuda.is_available():
        why = "PyTorch is not installed" if torch is None else "no CUDA device"
        raise SystemExit(
            f"XferType GPUD and CPU_GPU need GPU memory, and there is none here ({why}); "
            "-x 1 (CPU_ONLY) runs without a GPU."
        )
    if index >= torch.cuda.device_count():
        raise SystemExit(f"-d {index}: this machine has {torch.cuda.device_count()} GPU(s).")
    torch.cuda.set_device(index)
    return torch


class _Worker:
    """One thread's buffers and file for one run."""

    def __init__(self, xfer, write, path, io_size, gpu, route):
        self.xfer, self.write, self.io_size, self.route = xfer, write, io_size, route
        self.kvf = self.ctx = None
        self.fd = -1
        if xfer == 0:
            torch = _gpu.torch_module()
            self.dev = torch.empty(io_size, dtype=torch.uint8, device=f"cuda:{gpu}")
            self.ctx = _kvikio.opened(path, "r+" if write else "r", route)
            self.kvf = self.ctx.__enter__()
            if route == "gds":
                _kvikio.register_once(self.dev)
            self.direct = True
        else:
            self.fd, self.direct = _open(path, write, io_size)
            if xfer == 1:
                self.host = _io.aligned_empty(io_size)
            else:
                torch = _gpu.torch_module()
                self.pin = _gpu.Pinned(io_size)
                self.host = self.pin.np
                self.dev = torch.empty(io_size, dtype=torch.uint8, device=f"cuda:{gpu}")
                self.stream = torch.cuda.Stream()
        self.mv = [memoryview(self.host)] if xfer != 0 else None

    def load(self, data: np.ndarray) -> None:
        """Put the bytes a write will send into the buffer it sends from (untimed)."""
        if self.xfer == 0:
            torch = _gpu.torch_module()
            self.dev.copy_(torch.from_numpy(data))
        elif self.xfer == 1:
            self.host[:] = data
        else:
            torch = _gpu.torch_module()
            self.dev.copy_(torch.from_numpy(data))

    def op(self, off: int) -> int:
        n = self.io_size
        if self.xfer == 0:
            if self.route == "kvikio-posix":  # raw_* are cuFile calls; compat mode uses pread
                fn = self.kvf.pwrite if self.write else self.kvf.pread
                return fn(self.dev, n, off).get()
            fn = self.kvf.raw_write if self.write else self.kvf.raw_read
            return fn(self.dev, n, off, 0)
        if self.xfer == 1:
            return (os.pwritev if self.write else os.preadv)(self.fd, self.mv, off)
        torch = _gpu.torch_module()
        with torch.cuda.stream(self.stream):
            if self.write:
                self.pin.t.copy_(self.dev, non_blocking=True)
                self.stream.synchronize()
                return os.pwritev(self.fd, self.mv, off)
            got = os.preadv(self.fd, self.mv, off)
            self.dev.copy_(self.pin.t, non_blocking=True)
            self.stream.synchronize()
            return got

    def holds(self) -> np.ndarray:
        if self.xfer == 1:
            return self.host
        return self.dev.cpu().numpy()

    def close(self) -> None:
        if self.ctx is not None:
            self.ctx.__exit__(None, None, None)
        if self.fd >= 0:
            os.close(self.fd)


def run_one(
    files: list,
    region: int,
    xfer: int,
    io_type: int,
    threads: int,
    io_size: int,
    seconds: Optional[float],
    verify: bool,
    gpu: int,
    route: str,
) -> dict:
    """One gdsio run. ``files[t]`` and ``t * region`` (with -f) say where thread t works."""
    write = io_type in (1, 3)
    rand = io_type in (2, 3)
    nops = region // io_size
    if nops == 0:
        raise SystemExit(
            f"each thread's share ({region} bytes) is smaller than one I/O ({io_size}); "
            "raise -s or lower -i or -w."
        )
    workers = [_Worker(xfer, write, files[t], io_size, gpu, route) for t in range(threads)]
    lat_sum = [0] * threads
    ops = [0] * threads
    bad: list = []
    barrier = threading.Barrier(threads + 1)
    stop_at = [0.0]

    def run(t: int) -> None:
        w = workers[t]
        base = 0 if len(set(files)) > 1 else t * region
        rng = np.random.default_rng(t)
        order = rng.integers(0, nops, nops) if rand else np.arange(nops)
        if write and not verify:
            w.load(np.random.default_rng(100 + t).integers(0, 256, io_size, dtype=np.uint8))
        clock = time.perf_counter_ns
        k = 0
        barrier.wait()
        try:
            while True:
                if seconds is None:
                    if k >= nops:
                        break
                elif time.perf_counter() >= stop_at[0]:
                    break
                off = base + int(order[k % nops]) * io_size
                if write and verify:
                    w.load(pattern(off, io_size))
                t0 = clock()
                got = w.op(off)
                lat_sum[t] += clock() - t0
                ops[t] += 1
                k += 1
                if got != io_size:
                    raise OSError(f"short {'write' if write else 'read'} of {got} at {off}")
                if verify and not write and not np.array_equal(w.holds(), pattern(off, io_size)):
                    bad.append(off)
        except BaseException as e:
            bad.append(e)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    start = time.perf_counter()
    stop_at[0] = start + (seconds or 0)
    barrier.wait()
    for th in pool:
        th.join()
    total = time.perf_counter() - start
    direct = all(w.direct for w in workers)
    for w in workers:
        w.close()
    for b in bad:
        if isinstance(b, BaseException):
            raise b
    nops_done = sum(ops)
    done = nops_done * io_size
    return {
        "io_type": IOTYPE[io_type],
        "xfer_type": XFER[xfer],
        "path": route,
        "threads": threads,
        "io_size": io_size,
        "done_kib": done // 1024,
        "total_kib": region * threads // 1024,
        "gibps": done / total / (1 << 30),
        "avg_lat_us": sum(lat_sum) / max(1, nops_done) / 1000,
        "ops": nops_done,
        "total_time_s": total,
        "o_direct": direct,
        "verified": (not bad) if verify and not write else "",
    }


def line(r: dict) -> str:
    return (
        f"IoType: {r['io_type']} XferType: {r['xfer_type']} Threads: {r['threads']} "
        f"DataSetSize: {r['done_kib']}/{r['total_kib']}(KiB) IOSize: {r['io_size'] // 1024}(KiB) "
        f"Throughput: {r['gibps']:.6f} GiB/sec, Avg_Latency: {r['avg_lat_us']:.6f} usecs "
        f"ops: {r['ops']} total_time {r['total_time_s']:.6f} secs"
    )


def fio_run(
    args, files: list, region: int, io_type: int, threads: int, io_size: int, direct: bool
) -> Optional[dict]:
    """fio with the same file(s), I/O type, size, job count and time limit."""
    fio = shutil.which("fio")
    if fio is None:
        print("fio: not found, no comparison")
        return None
    cmd = [
        fio,
        "--name=millrace-gds",
        f"--rw={FIO_RW[io_type]}",
        f"--bs={io_size}",
        f"--numjobs={threads}",
        f"--size={region}",
        f"--direct={int(direct)}",
        "--ioengine=psync",
        "--group_reporting",
        "--output-format=json",
    ]
    if args.dir:
        cmd += [f"--directory={args.dir}", "--filename_format=gdsio.$jobnum"]
    else:
        cmd += [f"--filename={files[0]}", f"--offset_increment={region}"]
    if io_type in (0, 2):
        cmd.append("--readonly")
    if args.seconds:
        cmd += ["--time_based", f"--runtime={max(1, round(args.seconds))}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        print(f"fio failed: {out.stderr.strip()}", file=sys.stderr)
        return None
    job = json.loads(out.stdout[out.stdout.index("{") :])["jobs"][0]
    part = job["write" if io_type in (1, 3) else "read"]
    return {
        "gibps": part["bw_bytes"] / (1 << 30),
        "avg_lat_us": part.get("clat_ns", {}).get("mean", 0) / 1000,
        "ops": part["total_ios"],
        "secs": part["runtime"] / 1000,
    }


def _route_for_gpud() -> str:
    """The path -x 0 takes: forced by MILLRACE_GPU_PATH, else KvikIO's cuFile path."""
    choice = _kvikio.requested(None)
    if choice in ("auto", "cufile"):
        choice = "cufile"
    if choice == "cpu":
        raise SystemExit("-x 0 (GPUD) goes through KvikIO; MILLRACE_GPU_PATH=cpu is -x 1 or 2.")
    try:
        return _kvikio.plan(choice, True)
    except Exception as e:
        raise SystemExit(f"-x 0 (GPUD) cannot run here: {e}") from None


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    xfers = [int(x) for x in args.xfer.split(",")]
    for x in xfers:
        if x not in XFER:
            raise SystemExit(f"-x {x}: this bench does 0 (GPU_DIRECT), 1 (CPU_ONLY), 2 (CPU_GPU).")
    sizes = [parse_size(s) for s in args.io_size.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    write = args.io_type in (1, 3)
    if any(x != 1 for x in xfers):
        _gpu_ready(args.gpu)
    route = {1: "cpu", 2: "cpu"}
    if 0 in xfers:
        route[0] = _route_for_gpud()
        print(f"millrace path for GPUD: {route[0]} ({_gpu.describe()})", flush=True)
    h2d = None
    if args.h2d:
        torch = _gpu.torch_module()
        if torch is None or not torch.cuda.is_available():
            print("host-to-device copy rate: not measured (no CUDA device)")
        else:
            h2d = _gpu.h2d_rate(1 << 30)
            print(
                f"host-to-device copy rate (pinned, the CPU_GPU ceiling): "
                f"{h2d / (1 << 30):.6f} GiB/sec",
                flush=True,
            )
    rows = []
    for threads in thread_counts:
        if args.dir:
            if not args.size:
                raise SystemExit("-D needs -s (each thread's file size).")
            os.makedirs(args.dir, exist_ok=True)
            files = [os.path.join(args.dir, f"gdsio.{t}") for t in range(threads)]
            region = args.size
        else:
            size = args.size or (os.path.getsize(args.file) if os.path.exists(args.file) else 0)
            if not size:
                raise SystemExit(f"{args.file!r} does not exist; give -s to create it.")
            files = [args.file] * threads
            region = size // threads
        for fn in sorted(set(files)):
            need = region if args.dir else region * threads
            if write and not args.verify and os.path.exists(fn):
                if os.path.getsize(fn) < need:
                    os.truncate(fn, need)
            else:
                _fill(fn, need)
        for x in xfers:
            for io_size in sizes:
                share = _io.round_down(region, io_size)
                r = run_one(
                    files,
                    share,
                    x,
                    args.io_type,
                    threads,
                    io_size,
                    args.seconds,
                    args.verify,
                    args.gpu,
                    route[x],
                )
                print(line(r), flush=True)
                if write and args.verify:
                    print("Verifying data", flush=True)
                    back = run_one(
                        files, share, x, 0, threads, io_size, None, True, args.gpu, route[x]
                    )
                    print(line(back), flush=True)
                    r["verified"] = back["verified"]
                    if not back["verified"]:
                        print("data verification failed", file=sys.stderr)
                        return 1
                elif args.verify and r["verified"] is False:
                    print("data verification failed", file=sys.stderr)
                    return 1
                if h2d:
                    r["h2d_gibps"] = h2d / (1 << 30)
                if args.fio:
                    f = fio_run(args, files, share, args.io_type, threads, io_size, r["o_direct"])
                    if write and args.verify:
                        # fio wrote its own bytes: the next run verifies against the pattern
                        for fn in sorted(set(files)):
                            _fill(fn, region if args.dir else region * threads, force=True)
                    if f:
                        r["fio_gibps"], r["ratio_fio"] = f["gibps"], r["gibps"] / f["gibps"]
                        print(
                            f"fio (same file, {FIO_RW[args.io_type]}, bs {io_size // 1024}KiB, "
                            f"{threads} jobs, direct={int(r['o_direct'])}): Throughput: "
                            f"{f['gibps']:.6f} GiB/sec, Avg_Latency: {f['avg_lat_us']:.6f} "
                            f"usecs ops: {f['ops']}; millrace/fio {r['ratio_fio']:.3f}",
                            flush=True,
                        )
                rows.append(r)
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        plot(rows, args.plot)
    return 0


COLUMNS = [
    "io_type",
    "xfer_type",
    "path",
    "threads",
    "io_size",
    "done_kib",
    "total_kib",
    "gibps",
    "avg_lat_us",
    "ops",
    "total_time_s",
    "o_direct",
    "verified",
    "fio_gibps",
    "ratio_fio",
    "h2d_gibps",
]


def write_csv(rows: list, path: str) -> None:
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, restval="", extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in sorted({(r["xfer_type"], r["path"], r["threads"]) for r in rows}):
        pts = sorted(
            (r["io_size"], r["gibps"], r.get("fio_gibps"))
            for r in rows
            if (r["xfer_type"], r["path"], r["threads"]) == key
        )
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], "-o", label=f"{key[0]} ({key[1]}) {key[2]} thr")
        if all(p[2] for p in pts):
            ax.plot(xs, [p[2] for p in pts], "--x", label=f"fio {key[2]} jobs")
    h2d = [r["h2d_gibps"] for r in rows if r.get("h2d_gibps")]
    if h2d:
        ax.axhline(h2d[0], color="gray", linestyle=":", label="pinned H2D copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("I/O size (bytes)")
    ax.set_ylabel("GiB/s")
    ax.set_title(f"millrace-bench gds ({rows[0]['io_type'] if rows else ''})")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
