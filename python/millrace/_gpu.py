"""GPU side: device checks, pinned staging buffers, host-to-device pipelines and cuFile.

PyTorch provides device memory, pinned host memory, streams and events. cuFile (GPUDirect
Storage) is reached through ``ctypes`` on ``libcufile.so`` from the CUDA toolkit, so no extra
Python package is needed for it: the five calls we use (DriverOpen, HandleRegister, Read, Write,
HandleDeregister) have been stable since GDS 1.0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import Any, Optional

import numpy as np

from . import _io
from .errors import DeviceUnavailableError, MillraceError, TruncatedFileError

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


# --------------------------------------------------------------------------------------------
# cuFile through ctypes


class _CUfileError(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class _CUfileHandleUnion(ctypes.Union):
    _fields_ = [("fd", ctypes.c_int), ("handle", ctypes.c_void_p)]


class _CUfileDescr(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("handle", _CUfileHandleUnion),
        ("fs_ops", ctypes.c_void_p),
    ]


_CU_FILE_HANDLE_TYPE_OPAQUE_FD = 1


class CuFile:
    """Minimal cuFile binding. ``CuFile.get()`` returns the shared instance or None."""

    _instance: Optional[CuFile] = None
    _why_not = ""
    _lock = threading.Lock()

    def __init__(self, lib: ctypes.CDLL, path: str):
        self.lib = lib
        self.path = path
        lib.cuFileDriverOpen.restype = _CUfileError
        lib.cuFileDriverOpen.argtypes = []
        lib.cuFileHandleRegister.restype = _CUfileError
        lib.cuFileHandleRegister.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(_CUfileDescr),
        ]
        lib.cuFileHandleDeregister.restype = None
        lib.cuFileHandleDeregister.argtypes = [ctypes.c_void_p]
        for name in ("cuFileRead", "cuFileWrite"):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_ssize_t
            fn.argtypes = [
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_size_t,
                ctypes.c_int64,
                ctypes.c_int64,
            ]
        st = lib.cuFileDriverOpen()
        if st.err != 0:
            raise OSError(f"cuFileDriverOpen failed with cuFile error {st.err}/{st.cu_err}")
        self.native = os.path.exists("/proc/driver/nvidia-fs")

    @classmethod
    def find_library(cls) -> Optional[str]:
        names = [ctypes.util.find_library("cufile")]
        for root in [
            os.environ.get("CUDA_HOME", ""),
            "/usr/local/cuda",
            *glob.glob("/usr/local/cuda-*"),
        ]:
            if root:
                names += sorted(glob.glob(os.path.join(root, "lib64", "libcufile.so*")))
                names += sorted(glob.glob(os.path.join(root, "targets/*/lib", "libcufile.so*")))
        try:
            import nvidia  # pip wheels put libcufile under nvidia/*/lib

            for p in nvidia.__path__:
                names += sorted(glob.glob(os.path.join(p, "*", "lib", "libcufile.so*")))
        except ImportError:
            pass
        for n in names:
            if n and "rdma" not in n:
                return n
        return None

    @classmethod
    def get(cls) -> Optional[CuFile]:
        with cls._lock:
            if cls._instance is not None or cls._why_not:
                return cls._instance
            if os.environ.get("MILLRACE_NO_GDS"):
                cls._why_not = "disabled by MILLRACE_NO_GDS"
                return None
            torch = torch_module()
            if torch is None or not torch.cuda.is_available():
                cls._why_not = "no CUDA device"
                return None
            path = cls.find_library()
            if path is None:
                cls._why_not = "libcufile.so (CUDA toolkit GDS library) not found"
                return None
            try:
                torch.cuda.init()
                cls._instance = CuFile(ctypes.CDLL(path), path)
            except (OSError, AttributeError) as e:
                cls._why_not = f"cuFile could not be opened from {path} ({e})"
            return cls._instance

    @classmethod
    def why_not(cls) -> str:
        cls.get()
        return cls._why_not

    def mode(self) -> str:
        if self.native:
            return "native GPUDirect (nvidia-fs loaded)"
        return "compatibility mode (nvidia-fs kernel module not loaded: cuFile bounces via host)"

    def register(self, fd: int) -> ctypes.c_void_p:
        descr = _CUfileDescr()
        descr.type = _CU_FILE_HANDLE_TYPE_OPAQUE_FD
        descr.handle.fd = fd
        handle = ctypes.c_void_p()
        st = self.lib.cuFileHandleRegister(ctypes.byref(handle), ctypes.byref(descr))
        if st.err != 0:
            raise MillraceError(
                f"cuFileHandleRegister failed (cuFile error {st.err}, CUDA error {st.cu_err}): "
                "cuFile cannot use this file's filesystem (see cufile.log); pass gds=False or "
                "gds=None to read through pinned host buffers."
            )
        return handle

    def deregister(self, handle) -> None:
        self.lib.cuFileHandleDeregister(handle)

    def read(self, handle, dev_ptr: int, size: int, file_offset: int, dev_offset: int) -> int:
        n = self.lib.cuFileRead(handle, dev_ptr, size, file_offset, dev_offset)
        if n < 0:
            raise OSError(-n if n > -5000 else 5, f"cuFileRead failed with {n}")
        return n

    def write(self, handle, dev_ptr: int, size: int, file_offset: int, dev_offset: int) -> int:
        n = self.lib.cuFileWrite(handle, dev_ptr, size, file_offset, dev_offset)
        if n < 0:
            raise OSError(-n if n > -5000 else 5, f"cuFileWrite failed with {n}")
        return n


def use_gds(gds: Optional[bool]) -> Optional[CuFile]:
    """Decide whether to use cuFile. gds=None: only when native GPUDirect is there."""
    if gds is False:
        return None
    cf = CuFile.get()
    if gds is True and cf is None:
        raise DeviceUnavailableError(
            f"gds=True was requested but cuFile is unavailable ({CuFile.why_not()}); "
            "pass gds=None to use the pinned-buffer path."
        )
    if gds is None and cf is not None and not cf.native:
        return None
    return cf


def describe() -> str:
    """One line saying which data path is in use and why."""
    torch = torch_module()
    if torch is None:
        return "path: cpu only (PyTorch not installed, so no GPU memory); O_DIRECT + threads"
    if not torch.cuda.is_available():
        return (
            f"path: cpu only (PyTorch {torch.__version__} sees no CUDA device); O_DIRECT + threads"
        )
    name = torch.cuda.get_device_name()
    cf = CuFile.get()
    if cf is None:
        return (
            f"path: cpu-gpu bounce through pinned buffers on {name} "
            f"(no GDS: {CuFile.why_not()}); PyTorch {torch.__version__}"
        )
    default = "gds" if cf.native else "cpu-gpu bounce (gds=True to use cuFile's compat mode)"
    return (
        f"path: default {default} on {name}; cuFile {cf.path} in {cf.mode()}; "
        f"PyTorch {torch.__version__}"
    )


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
    gds: Optional[CuFile] = None,
    gds_required: bool = False,
) -> None:
    """Fill the uint8 CUDA tensor ``dest[:length]`` with file bytes [offset, offset+length).

    Without GDS: every worker owns a CUDA stream and two pinned buffers; it reads the next chunk
    into one while the other's host-to-device copy runs on its stream. With GDS: each worker
    calls cuFileRead for its chunks straight into device memory.
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
    if gds is not None:
        try:
            handle = gds.register(f.fd_direct if f.direct else f.fd_buffered)
        except MillraceError:
            if gds_required:
                raise
            handle = None  # this filesystem is not usable by cuFile: take the pinned path
        if handle is not None:
            _gds_read(f, offset, length, dest, threads, chunk, gds, handle)
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


def _gds_read(f, offset, length, dest, threads, chunk, cf: CuFile, handle) -> None:
    torch = torch_module()
    base = dest.data_ptr()
    count = (length + chunk - 1) // chunk
    torch.cuda.synchronize(dest.device)

    def work(_w: int, i: int) -> None:
        lo = i * chunk
        n = min(chunk, length - lo)
        done = 0
        while done < n:
            got = cf.read(handle, base, n - done, offset + lo + done, lo + done)
            if got == 0:
                raise TruncatedFileError(
                    f"{f.path!r} ended at byte {offset + lo + done} while reading up to byte "
                    f"{offset + length}; the file was truncated. Re-copy it and retry."
                )
            done += got

    try:
        _io.run_parallel(count, threads, work)
    finally:
        cf.deregister(handle)


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
