"""Millrace GPU client: move data between files and GPU (or host) memory as fast as possible.

    import millrace
    buf = millrace.read("/data/shard-0001.bin", device="cuda")   # torch tensor; "cpu": NumPy
    ds = millrace.ShardDataset("/data/train-*.safetensors", device="cuda", batch_size=256)
    millrace.save_checkpoint(model.state_dict(), "/ckpt/step-1000.safetensors")
    state = millrace.load_checkpoint("/ckpt/step-1000.safetensors", device="cuda")

Only NumPy is required. PyTorch is used for GPU memory when installed, and RAPIDS KvikIO
(``pip install millrace[gpu-cu12]`` or ``[gpu-cu13]``) for GPUDirect Storage, cuFile's
compatibility mode or KvikIO's POSIX path; ``millrace.last_transfer()`` says which moved the
bytes of the last call, ``MILLRACE_GPU_PATH`` or ``via=`` forces one.
"""

from __future__ import annotations

from ._gpu import describe
from ._kvikio import PATHS, last_transfer
from .checkpoint import load_checkpoint, save_checkpoint
from .core import read, write
from .errors import (
    DeviceUnavailableError,
    DTypeMismatchError,
    FormatError,
    MillraceError,
    TruncatedFileError,
)

__version__ = "0.1.0"

__all__ = [
    "PATHS",
    "DTypeMismatchError",
    "DeviceUnavailableError",
    "FormatError",
    "MillraceError",
    "ShardDataset",
    "TruncatedFileError",
    "describe",
    "last_transfer",
    "load_checkpoint",
    "read",
    "save_checkpoint",
    "write",
]


def __getattr__(name):
    # The dataset imports torch (when present) to subclass IterableDataset; load it on demand so
    # that "import millrace" stays fast.
    if name == "ShardDataset":
        from .dataset import ShardDataset

        return ShardDataset
    raise AttributeError(f"module 'millrace' has no attribute {name!r}")
