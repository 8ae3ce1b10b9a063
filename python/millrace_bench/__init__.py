"""gdsio-like benchmark of the millrace client.

``python -m millrace_bench FILE --sizes 4K,1M --threads 1,4 ...`` (the grid, below),
``millrace-bench gds -f FILE -x 0 -w 8 -i 1M ...`` (gdsio's flags and line: gdsio.py) and
``millrace-bench parquet DIR`` (cuDF, KvikIO compat mode off and on: parquet.py).

Modes (as gdsio's -x): ``cpu`` reads into aligned host memory (O_DIRECT), ``cpu-gpu`` reads
into a pinned buffer and copies it to GPU memory (bounce), ``gds`` reads with cuFile straight
into GPU memory (KvikIO's cuFile handle). Each thread reads its own contiguous region of the
file, sequentially (or at random with --pattern rand), one transfer at a time; latency is per
transfer, from the start of its read until its bytes are on the GPU in cpu-gpu mode. In cpu-gpu
mode transfers under --coalesce bytes (1M) are still read one by one but go to the GPU a batch
per copy, overlapped with the next batch's reads (--coalesce 0: one copy per transfer, waited
for, as gdsio). With fio installed every cell is also run by fio with the same file, block
size, job count and pattern, alternating with ours in the same run, and the ratio is reported:
against fio for cpu, against min(fio, pinned host-to-device rate) for cpu-gpu and gds.

--whole adds whole-file reads (millrace.read to cpu and cuda, the naive
torch.from_numpy(np.fromfile(f)).cuda(), the pinned host-to-device rate, fio on the file) and
--checkpoint-gb N adds a save/load of an N GB state dict against fio writing and reading as
much on the same filesystem.

Not part of the ``millrace`` package: the client needs none of it at run time. Modules: grid (the
gdsio-style cells), whole_file, checkpoint, report (table, CSV, plot), cli (the command line).
"""

from __future__ import annotations

from .cli import main
from .common import drop_cache, gds_usable, parse_size
from .grid import run_cell

# The name the tests and older scripts used.
_gds_usable = gds_usable

__all__ = ["drop_cache", "gds_usable", "main", "parse_size", "run_cell"]
