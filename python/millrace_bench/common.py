"""What the bench's parts share: sizes, timing, the cache, result rows."""

from __future__ import annotations

import argparse
import os
import resource

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


def _median_row(rows: list) -> dict:
    """The run with the median throughput (the lower middle one for an even count)."""
    return sorted(rows, key=lambda r: r["gbps"])[(len(rows) - 1) // 2]


def gds_usable(path: str) -> str:
    """Empty if KvikIO can read ``path`` through cuFile (GDS or cuFile's compat mode, compat
    mode OFF so KvikIO does not fall back quietly), else why not."""
    from millrace import _kvikio

    why = _kvikio.io_ready()
    if why:
        return why
    if not _kvikio.cufile_usable():
        return "KvikIO finds no usable cuFile (it prefers its compat mode with AUTO)"
    route = "gds" if _kvikio.gds_available() else "cufile-compat"
    try:
        with _kvikio.opened(path, "r", route):
            pass
    except Exception as e:
        return f"KvikIO cannot open {path!r} through cuFile ({e})"
    return ""
