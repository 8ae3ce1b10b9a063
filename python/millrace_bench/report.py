"""What a run leaves: the table lines it prints, the CSV and the plot."""

from __future__ import annotations

import csv

from .common import COLUMNS


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


def write_csv(rows: list, path: str) -> None:
    extra_cols = sorted({k for r in rows for k in r} - set(COLUMNS))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS + extra_cols, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
