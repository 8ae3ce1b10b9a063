"""The command line: ``python -m millrace_bench FILE --sizes 4K,1M --threads 1,4 ...``."""

from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np

import millrace_bench
from millrace import _gpu, _io

from .checkpoint import checkpoint_bench
from .common import DEFAULT_COALESCE, _median_row, gds_usable, parse_size
from .grid import fio_cell, run_cell
from .report import make_plot, write_csv
from .whole_file import whole_file


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m millrace_bench",
        description=millrace_bench.__doc__,
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
    return p


def create_file(path: str, size: int) -> None:
    """``size`` random bytes at ``path``, on disk before the run reads them."""
    chunk = np.random.default_rng(1).integers(0, 256, 64 << 20, dtype=np.uint8)
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            fh.write(chunk[: min(left, chunk.size)].tobytes())
            left -= chunk.size
        os.fsync(fh.fileno())


def usable_modes(wanted: str, path: str, gpu: bool) -> list:
    """The modes asked for that this machine can run; says why it skips the others."""
    modes = [m.strip() for m in wanted.split(",") if m.strip()]
    for m in list(modes):
        if m not in ("cpu", "cpu-gpu", "gds"):
            raise SystemExit(f"unknown mode {m!r}; use cpu, cpu-gpu or gds.")
        if m != "cpu" and not gpu:
            print(f"skipping mode {m}: no CUDA device (PyTorch with CUDA is needed)")
            modes.remove(m)
        elif m == "gds":
            why = gds_usable(path)
            if why:
                print(f"skipping mode gds: {why}")
                modes.remove(m)
    return modes


def run_grid(args, sizes: list, threads: list, modes: list, use_fio: bool, h2d) -> list:
    """Every cell of sizes x threads, each mode and fio taking turns; prints a line per cell."""
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
    return rows


def _printed(rows: list) -> list:
    for r in rows:
        print(json.dumps(r), flush=True)
    return rows


def main(argv=None) -> int:
    """``millrace-bench gds ...`` (gdsio's flags), ``millrace-bench parquet ...`` (cuDF), or
    the grid: ``millrace-bench FILE --sizes ...``."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "gds":
        from . import gdsio

        return gdsio.main(argv[1:])
    if argv and argv[0] == "parquet":
        from . import parquet

        return parquet.main(argv[1:])
    args = parser().parse_args(argv)
    print(_gpu.describe(), flush=True)
    if args.create and not os.path.exists(args.file):
        create_file(args.file, args.create)
    _io.check_path(args.file)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    torch = _gpu.torch_module()
    gpu = torch is not None and torch.cuda.is_available()
    modes = usable_modes(args.mode, args.file, gpu)
    use_fio = args.fio == "auto" and shutil.which("fio") is not None
    if "cpu" in modes and not use_fio:
        print("fio comparison: off (" + ("--fio no" if args.fio == "no" else "fio not found") + ")")
    needs_h2d = gpu and (args.whole or any(m != "cpu" for m in modes))
    h2d = _gpu.h2d_rate(1 << 30) if needs_h2d else None
    if h2d:
        print(f"pinned host-to-device rate: {h2d / 1e9:.1f} GB/s", flush=True)
    rows = run_grid(args, sizes, threads, modes, use_fio, h2d)
    if args.whole:
        rows += _printed(whole_file(args.file, args.whole_threads, args.repeat, h2d))
    if args.checkpoint_gb:
        directory = os.path.dirname(os.path.abspath(args.file))
        rows += _printed(
            checkpoint_bench(directory, args.checkpoint_gb, args.whole_threads, args.repeat)
        )
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        make_plot(rows, args.plot)
    return 0


def entry() -> None:
    """The ``millrace-bench`` console script."""
    import sys

    sys.exit(main())
