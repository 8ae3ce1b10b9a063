"""GPU side: device checks, pinned staging buffers and the host-to-device pipeline.

PyTorch provides device memory, pinned host memory, streams and events. cuFile (GPUDirect
Storage) is reached through RAPIDS KvikIO (``_kvikio``), an optional extra; this module is the
``cpu`` path for GPU memory when KvikIO is absent or not chosen.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from . import _io
from .errors import DeviceUnavailableError, TruncatedFileError

_torch: Any = None
_torch_tried = False


def torch_module():
    """The torch module, or None when it is not installed (imported once, lazily)."""
    global _torch, _torch_tried
    if not _torch_tried:
        _torch_tried = True
        try:
            import torch

            _torch = torch
        except ImportError:
            _torch = None
    return _torch


def is_cuda_device(device) -> bool:
    if device is None:
        return False
    return str(device).split(":")[0] == "cuda"


def check_device(device) -> Any:
    """Validate ``device`` and return a torch.device for CUDA, or None for "cpu"."""
    if device is None or str(device) == "cpu":
        return None
    if not is_cuda_device(device):
        raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {device!r}.")
    torch = torch_module()
    if torch is None:
        raise DeviceUnavailableError(
            f"device={str(device)!r} needs PyTorch for GPU memory, and PyTorch is not installed; "
            "install torch with CUDA support, or pass device='cpu' to get NumPy arrays."
        )
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device={str(device)!r} was requested but no CUDA device is available "
            "(torch.cuda.is_available() is False); pass device='cpu' on machines without a GPU."
        )
    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device={str(device)!r} was requested but this machine has only "
            f"{torch.cuda.device_count()} CUDA device(s); pick an index below that."
        )
    return torch.device("cuda", index)


def describe() -> str:
    """One line saying which data paths this process has and why (KvikIO's own answers)."""
    from . import _kvikio

    torch = torch_module()
    why = _kvikio.io_ready()
    kv = _kvikio.module()
    if why:
        kvio = f"KvikIO: no ({why})"
    else:
        gds = "GDS available" if _kvikio.gds_available(kv) else "GDS not available"
        cf = "cuFile usable" if _kvikio.cufile_usable(kv) else "no usable cuFile"
        kvio = (
            f"KvikIO {kv.__version__}: {cf}, {gds}, compat mode "
            f"{kv.CompatMode(kv.defaults.get('compat_mode')).name}; GPU memory default "
            f"{_kvikio.default_path(True, kv)}"
        )
    forced = os.environ.get(_kvikio.ENV)
    forced = f"; {_kvikio.ENV}={forced}" if forced else ""
    if torch is None:
        gpu = "cpu only (PyTorch not installed, so no GPU memory)"
    elif not torch.cuda.is_available():
        gpu = f"cpu only (PyTorch {torch.__version__} sees no CUDA device)"
    else:
        gpu = f"{torch.cuda.get_device_name()} (PyTorch {torch.__version__})"
    return f"path: {gpu}; host memory default cpu (O_DIRECT + threads); {kvio}{forced}"


# --------------------------------------------------------------------------------------------
# pinned staging


class Pinned:
    """An aligned pinned host buffer seen both as a NumPy array and a torch tensor."""

    def __init__(self, nbytes: int):
        torch = torch_module()
        raw = torch.empty(nbytes + _io.ALIGN, dtype=torch.uint8, pin_memory=True)
        shift = (-raw.data_ptr()) % _io.ALIGN
        self.t = raw[shift : shift + nbytes]
        self.np = self.t.numpy()


def tensor_bytes(t):
    """A flat uint8 view of a torch tensor's bytes (contiguous copy if it is not contiguous)."""
    torch = torch_module()
    t = t.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(torch.uint8)


def read_to_device(
    f: _io.InputFile,
    offset: int,
    length: int,
    dest,
    threads: Optional[int] = None,
    chunk: int = _io.DEFAULT_CHUNK,
) -> None:
    """Fill the uint8 CUDA tensor ``dest[:length]`` with file bytes [offset, offset+length).

    The ``cpu`` path for GPU memory (no KvikIO): every worker owns a CUDA stream and two pinned
    buffers; it reads the next chunk into one while the other's host-to-device copy runs on its
    stream.
    """
    torch = torch_module()
    threads = _io.default_threads(threads)
    chunk = max(_io.ALIGN, _io.round_down(chunk))
    if offset + length > f.size:
        raise TruncatedFileError(
            f"{f.path!r} has {f.size} bytes but bytes {offset}..{offset + length} were asked "
            "for; the file is truncated or the request is wrong."
        )
    if length == 0:
        return
    start = _io.round_down(offset)
    end = offset + length
    span = end - start
    count = (span + chunk - 1) // chunk
    threads = max(1, min(threads, count))
    device = dest.device
    with torch.cuda.device(device):
        streams = [torch.cuda.Stream(device) for _ in range(threads)]
        bufs = [[Pinned(chunk), Pinned(chunk)] for _ in range(threads)]
        events: list = [[None, None] for _ in range(threads)]
        turn = [0] * threads

        def work(w: int, i: int) -> None:
            b = turn[w]
            turn[w] ^= 1
            if events[w][b] is not None:
                events[w][b].synchronize()
            lo = start + i * chunk
            hi = min(lo + chunk, _io.round_up(end))
            pin = bufs[w][b]
            got = f.pread_into(pin.np[: hi - lo], lo)
            use_lo = max(lo, offset)
            use_hi = min(lo + chunk, end)
            if got < use_hi - lo:
                raise TruncatedFileError(
                    f"{f.path!r} ended at byte {lo + got} while reading up to byte {end}; "
                    "the file was truncated (or is being rewritten). Re-copy it and retry."
                )
            s = streams[w]
            with torch.cuda.stream(s):
                dest[use_lo - offset : use_hi - offset].copy_(
                    pin.t[use_lo - lo : use_hi - lo], non_blocking=True
                )
                ev = torch.cuda.Event()
                ev.record(s)
            events[w][b] = ev

        try:
            _io.run_parallel(count, threads, work)
        finally:
            for s in streams:
                s.synchronize()


def pinned_staging(threads: int):
    """A ``make_staging`` for ``_io.write_parallel`` plus a map from staging array to tensor."""
    by_addr = {}

    def make(nbytes: int) -> np.ndarray:
        p = Pinned(nbytes)
        by_addr[p.np.ctypes.data] = p.t
        return p.np

    return make, by_addr


def h2d_rate(nbytes: int = 1 << 30, repeat: int = 5) -> float:
    """Measured pinned host-to-device copy rate in bytes/s (best of ``repeat``)."""
    torch = torch_module()
    import time

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    best = 0.0
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        best = max(best, nbytes / (time.perf_counter() - t0))
    return best
