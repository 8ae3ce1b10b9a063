"""``millrace-bench parquet``: read a Parquet dataset with cuDF, KvikIO compat mode on and off.

    millrace-bench parquet /data/parquet-dir [--compat off,on] [--repeat 3] [--columns a,b]
        [--csv out.csv] [--plot out.png] [--engine cudf|pyarrow] [--create-rows N]

cuDF reads local Parquet through KvikIO; KvikIO reads KVIKIO_COMPAT_MODE when it starts, so
each setting runs in its own child process (the page cache is dropped for the dataset's files
before every read). Reported per run: the dataset's bytes on disk over the read's wall time
(GB/s) and rows/s. ``--engine pyarrow`` reads with pyarrow into host memory instead: no cuDF,
no GPU, no KvikIO; it is there to check the harness on machines without a GPU and is labelled
``pyarrow-cpu`` everywhere, never as a cuDF number. --create-rows N writes a dataset of N rows
(8 columns) at the path first.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

from .common import drop_cache

NO_CUDF = (
    "cuDF is not importable here, so there is nothing to measure: install cudf-cu12 or "
    "cudf-cu13 on a machine with an NVIDIA GPU (or pass --engine pyarrow to check the harness "
    "on the CPU, labelled pyarrow-cpu)."
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="millrace-bench parquet",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a Parquet file or a directory of them")
    p.add_argument("--engine", choices=["cudf", "pyarrow"], default="cudf")
    p.add_argument("--compat", default="off,on", help="KvikIO compat mode settings to run")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--columns", help="only these columns (comma list)")
    p.add_argument("--create-rows", type=int, help="write a dataset of this many rows first")
    p.add_argument("--csv")
    p.add_argument("--plot")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def files_of(path: str) -> list:
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
    else:
        found = [path] if os.path.exists(path) else []
    if not found:
        raise SystemExit(f"no Parquet files at {path!r}.")
    return found


def create(path: str, rows: int, engine: str) -> None:
    """A dataset of ``rows`` rows in files of at most 1M rows each under directory ``path``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(0)
    per = 1 << 20
    for i, lo in enumerate(range(0, rows, per)):
        n = min(per, rows - lo)
        cols = {f"f{j}": rng.standard_normal(n) for j in range(4)}
        cols |= {f"i{j}": rng.integers(0, 1 << 40, n) for j in range(3)}
        cols["s"] = pa.array([f"row{k}" for k in range(lo, lo + n)])
        pq.write_table(pa.table(cols), os.path.join(path, f"part-{i:05d}.parquet"))


def child(args) -> int:
    """One process, one compat setting: read the dataset ``repeat`` times, print JSON rows."""
    files = files_of(args.path)
    nbytes = sum(os.path.getsize(f) for f in files)
    columns = args.columns.split(",") if args.columns else None
    if args.engine == "cudf":
        try:
            import cudf
        except Exception:
            print(NO_CUDF, file=sys.stderr)
            return 2
        import kvikio.defaults

        def read():
            df = cudf.read_parquet(files, columns=columns)
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            return len(df)

        compat = str(kvikio.defaults.is_compat_mode_preferred())
        label = "cudf"
    else:
        import pyarrow.parquet as pq

        def read():
            return pq.read_table(files, columns=columns).num_rows

        compat, label = "n/a", "pyarrow-cpu"
    for i in range(args.repeat):
        for f in files:
            drop_cache(f)
        t0 = time.perf_counter()
        rows = read()
        secs = time.perf_counter() - t0
        out = {
            "engine": label,
            "compat_mode": os.environ.get("KVIKIO_COMPAT_MODE", ""),
            "kvikio_compat_preferred": compat,
            "run": i,
            "bytes": nbytes,
            "rows": rows,
            "seconds": secs,
            "gbps": nbytes / secs / 1e9,
            "rows_per_s": rows / secs,
        }
        print(json.dumps(out), flush=True)
    return 0


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        return child(args)
    if args.engine == "cudf":
        try:
            import cudf  # noqa: F401
        except Exception:
            print(NO_CUDF)
            return 2
    if args.create_rows:
        create(args.path, args.create_rows, args.engine)
    files = files_of(args.path)
    settings = (
        ["n/a"] if args.engine == "pyarrow" else [s.strip().upper() for s in args.compat.split(",")]
    )
    if args.engine == "pyarrow":
        print("engine pyarrow-cpu: a CPU read with pyarrow to check the harness; not cuDF, no GPU")
    rows = []
    for setting in settings:
        env = dict(os.environ)
        if setting != "n/a":
            env["KVIKIO_COMPAT_MODE"] = setting
        cmd = [sys.executable, "-m", "millrace_bench", "parquet", args.path, "--child"]
        cmd += ["--engine", args.engine, "--repeat", str(args.repeat)]
        if args.columns:
            cmd += ["--columns", args.columns]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(f"compat {setting}: the read failed: {out.stderr.strip()}")
            continue
        runs = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
        rows += runs
        med = statistics.median(r["gbps"] for r in runs)
        rps = statistics.median(r["rows_per_s"] for r in runs)
        print(
            f"engine {runs[0]['engine']} compat {setting}: {len(files)} files, "
            f"{runs[0]['bytes'] / 1e9:.3f} GB, {runs[0]['rows']} rows: median "
            f"{med:.3f} GB/s, {rps:.4g} rows/s over {len(runs)} runs",
            flush=True,
        )
    if not rows:
        return 1
    if args.csv:
        import csv

        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    if args.plot:
        plot(rows, args.plot)
    return 0


def plot(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({(r["engine"], r["compat_mode"] or "n/a") for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(9, 4))
    for ax, field, unit in ((axes[0], "gbps", "GB/s"), (axes[1], "rows_per_s", "rows/s")):
        vals = [
            statistics.median(
                r[field] for r in rows if (r["engine"], r["compat_mode"] or "n/a") == k
            )
            for k in keys
        ]
        ax.bar([f"{e}\ncompat {c}" for e, c in keys], vals)
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle("millrace-bench parquet (median of runs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
