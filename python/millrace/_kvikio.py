"""RAPIDS KvikIO underneath: which path moves the bytes, and reads and writes through it.

KvikIO (``pip install millrace[gpu-cu12]`` or ``[gpu-cu13]``) reads and writes files from and
to device or host memory with its own thread pool. For device memory it calls cuFile, which
either does GPUDirect Storage (DMA between the drive and GPU memory) or, without nvidia-fs,
its own compatibility mode (POSIX I/O through host bounce buffers inside libcufile). With
KvikIO's compatibility mode on (``KVIKIO_COMPAT_MODE=ON``, or AUTO without a usable cuFile)
KvikIO skips cuFile and does POSIX I/O itself, through its own pinned bounce buffers. Host
memory is always read and written with POSIX calls by KvikIO's threads.

The paths, as reported per call (``millrace.last_transfer()``) and by the bench:

``gds``            KvikIO uses cuFile and ``kvikio.cufile_driver`` says GDS is available
``cufile-compat``  KvikIO uses cuFile, which says GDS is not available (its compat mode)
``kvikio-posix``   KvikIO's own POSIX path (compat mode, or host memory)
``cpu``            no KvikIO: millrace's own O_DIRECT threads on NumPy buffers (and, for GPU
                   memory, pinned buffers copied by PyTorch)

Every answer comes from KvikIO itself (``kvikio.defaults.is_compat_mode_preferred()``,
``kvikio.cufile_driver.get("is_gds_available")``), never from files under /proc. The user can
force a path per call (``via=``) or for the process (``MILLRACE_GPU_PATH``); forcing one that
KvikIO says cannot run here is an error, not a silent fallback.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import weakref
from typing import Any, Optional

import numpy as np

from .errors import DeviceUnavailableError, TruncatedFileError

PATHS = ("gds", "cufile-compat", "kvikio-posix", "cpu")
# "auto" picks per call; "cufile" is either cuFile path (what gds=True meant before KvikIO).
CHOICES = ("auto", "cufile", *PATHS)
ENV = "MILLRACE_GPU_PATH"

_lock = threading.RLock()  # guards KvikIO's global settings while a handle is opened
_kv: Any = None
_kv_tried = False
_kv_why = ""
_io_why: Optional[str] = None
_local = threading.local()


def module():
    """The kvikio module, or None when it cannot be imported (see ``why_not()``)."""
    global _kv, _kv_tried, _kv_why
    with _lock:
        if not _kv_tried:
            _kv_tried = True
            try:
                import kvikio
                import kvikio.cufile_driver
                import kvikio.defaults

                _kv = kvikio
            except Exception as e:  # ImportError, or a broken CUDA install under it
                _kv_why = f"KvikIO is not importable ({type(e).__name__}: {e})"
        return _kv


def io_ready() -> str:
    """Empty when KvikIO can move bytes in this process, else why not.

    KvikIO 26.10 imports without a GPU, but even a host-buffer read asks the CUDA driver
    (libcuda.so.1) what kind of memory it was given, so without the driver every transfer
    fails. This is found out once, by writing and reading back 4 KiB of a temporary file.
    """
    global _io_why
    with _lock:
        if _io_why is not None:
            return _io_why
        kv = module()
        if kv is None:
            _io_why = _kv_why
            return _io_why
        fd, tmp = tempfile.mkstemp(prefix="millrace-kvikio-probe-")
        os.close(fd)
        try:
            a = np.arange(4096, dtype=np.uint32).view(np.uint8)[:4096]
            b = np.zeros(4096, dtype=np.uint8)
            with kv.CuFile(tmp, "w") as f:
                f.write(a)
            with kv.CuFile(tmp, "r") as f:
                f.read(b)
            _io_why = "" if np.array_equal(a, b) else "KvikIO read back other bytes than written"
        except Exception as e:
            msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
            _io_why = f"KvikIO {kv.__version__} imports but cannot do I/O here ({msg})"
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return _io_why


def why_not() -> str:
    """Empty when KvikIO is usable, else the reason (import or I/O)."""
    return io_ready()


def _compat_mode(kv, on: bool):
    return kv.CompatMode.ON if on else kv.CompatMode.OFF


def gds_available(kv=None) -> bool:
    """KvikIO's answer: does cuFile report GDS (not only its compat mode) on this machine?"""
    kv = kv or module()
    if kv is None:
        return False
    try:
        return bool(kv.cufile_driver.get("is_gds_available"))
    except Exception:
        return False


def cufile_usable(kv=None) -> bool:
    """KvikIO's answer: with compat mode AUTO, would it use cuFile?"""
    kv = kv or module()
    if kv is None:
        return False
    with _lock, kv.defaults.set("compat_mode", kv.CompatMode.AUTO):
        return not kv.defaults.is_compat_mode_preferred()


def default_path(on_device: bool, kv=None) -> str:
    """The path KvikIO takes for a transfer now, from its own answers (assumes KvikIO works).

    Host memory: always ``kvikio-posix``. Device memory: ``kvikio-posix`` when KvikIO prefers
    its compat mode (KVIKIO_COMPAT_MODE=ON, or AUTO and no usable cuFile); otherwise cuFile,
    which is ``gds`` when the cuFile driver says GDS is available and ``cufile-compat`` if not.
    """
    kv = kv or module()
    if not on_device:
        return "kvikio-posix"
    if kv.defaults.is_compat_mode_preferred():
        return "kvikio-posix"
    return "gds" if gds_available(kv) else "cufile-compat"


def requested(via: Optional[str]) -> str:
    """The choice for this call: ``via`` if given, else ``MILLRACE_GPU_PATH``, else auto."""
    choice = via if via is not None else os.environ.get(ENV, "") or "auto"
    choice = choice.strip().lower()
    if choice not in CHOICES:
        src = "via" if via is not None else ENV
        raise ValueError(f"{src}={choice!r} is not one of {', '.join(CHOICES)}.")
    return choice


def plan(via: Optional[str], on_device: bool) -> str:
    """The path this call will take: one of PATHS. Raises DeviceUnavailableError when the
    path forced cannot run here, saying why (KvikIO's answer)."""
    choice = requested(via)
    if choice == "cpu":
        return "cpu"
    why = io_ready()
    if choice == "auto":
        if why or not on_device:
            # host memory: millrace's own O_DIRECT threads are the default (as fast as fio in
            # docs/PERFORMANCE.md); via="kvikio-posix" puts host transfers through KvikIO
            return "cpu"
        return default_path(True)
    if why:
        raise DeviceUnavailableError(
            f"the {choice!r} path was asked for (via= or {ENV}) but {why}; "
            "use via='cpu' (or leave it unset) for millrace's own I/O."
        )
    kv = module()
    if choice == "kvikio-posix":
        return choice
    if not on_device:
        raise DeviceUnavailableError(
            f"the {choice!r} path was asked for a host buffer; KvikIO moves host memory only "
            "with POSIX calls (via='kvikio-posix'). cuFile paths need GPU memory (device='cuda')."
        )
    if not cufile_usable(kv):
        raise DeviceUnavailableError(
            f"the {choice!r} path was asked for but KvikIO finds no usable cuFile "
            "(kvikio.defaults.is_compat_mode_preferred() is True with compat mode AUTO); "
            "install the CUDA driver and libcufile, or use via='kvikio-posix'."
        )
    gds = gds_available(kv)
    if choice == "cufile":
        return "gds" if gds else "cufile-compat"
    if choice == "gds" and not gds:
        raise DeviceUnavailableError(
            "the 'gds' path was asked for but kvikio.cufile_driver says GDS is not available "
            "(cuFile would run in its compatibility mode: via='cufile-compat'); GDS needs the "
            "nvidia-fs module or P2PDMA and a filesystem that supports it."
        )
    if choice == "cufile-compat" and gds:
        raise DeviceUnavailableError(
            "the 'cufile-compat' path was asked for but kvikio.cufile_driver says GDS is "
            "available, so cuFile would use it (via='gds'); run cuFile in compat mode through "
            "its own configuration (cufile.json) to measure that."
        )
    return choice


@contextlib.contextmanager
def opened(filename: str, flags: str, path: str):
    """A kvikio.CuFile opened for ``path`` (one of gds, cufile-compat, kvikio-posix): compat
    mode OFF for the cuFile paths (KvikIO then fails rather than falling back quietly), ON for
    kvikio-posix. The setting is KvikIO's global default, held only while the handle opens
    (the handle keeps the mode it was opened with)."""
    kv = module()
    with _lock, kv.defaults.set("compat_mode", _compat_mode(kv, path == "kvikio-posix")):
        f = kv.CuFile(filename, flags)
    try:
        yield f
    finally:
        f.close()


@contextlib.contextmanager
def opened_or_posix(filename: str, flags: str, path: str, fallback: bool):
    """``opened``, except that with ``fallback`` (the path was chosen, not forced) a file that
    cuFile refuses (cuFileHandleRegister fails: a filesystem it cannot use) is opened on
    KvikIO's POSIX path instead, as KvikIO's AUTO mode would. Yields (handle, path used)."""
    try:
        ctx = opened(filename, flags, path)
        f = ctx.__enter__()
    except Exception:
        if not fallback or path == "kvikio-posix":
            raise
        path = "kvikio-posix"
        ctx = opened(filename, flags, path)
        f = ctx.__enter__()
    try:
        yield f, path
    finally:
        ctx.__exit__(None, None, None)


def configure(threads: int, task_size: int) -> None:
    """KvikIO's thread pool size and task size (changed only when they differ: a new pool
    size restarts the pool)."""
    kv = module()
    with _lock:
        if kv.defaults.get("num_threads") != threads:
            kv.defaults.set("num_threads", threads)
        if kv.defaults.get("task_size") != task_size:
            kv.defaults.set("task_size", task_size)


# --------------------------------------------------------------------------------------------
# what the last call did


def record(op: str, path: str, nbytes: int, seconds: float, **by_path) -> None:
    _local.last = {
        "op": op,
        "path": path,
        "bytes": nbytes,
        "seconds": seconds,
        "bytes_by_path": by_path or {path: nbytes},
    }


def last_transfer() -> Optional[dict]:
    """What this thread's last read, write, save or load did: ``op``, ``path`` (gds,
    cufile-compat, kvikio-posix or cpu), ``bytes``, ``seconds``, and ``bytes_by_path`` when a
    checkpoint mixed host and GPU tensors (host ones always go kvikio-posix under KvikIO)."""
    return getattr(_local, "last", None)


# --------------------------------------------------------------------------------------------
# buffers registered with cuFile once, deregistered when their tensor goes


class _DevicePtr:
    """Stands for a device allocation when deregistering it after its tensor is gone."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
        }


_registered: dict = {}  # storage data_ptr -> weakref.finalize on the storage


def _deregister(ptr: int, nbytes: int) -> None:
    kv = module()
    _registered.pop(ptr, None)
    with contextlib.suppress(Exception):
        kv.memory_deregister(_DevicePtr(ptr, nbytes))


def register_once(tensor) -> bool:
    """Register the GPU memory under ``tensor`` with cuFile unless done already, for buffers
    written or read again and again (a model's parameters, a bench's buffer).

    Kept per storage, not per tensor object: ``model.state_dict()`` hands out new tensor
    objects on every call, over the same storages. Deregistered when the storage is freed
    (PyTorch keeps one Python object per live storage, so a finalizer on it runs then). False
    when cuFile refused, e.g. because KvikIO registers the whole CUDA allocation and another
    storage in the same allocation registered it already; transfers work either way, a
    registered buffer only spares cuFile its own bounce buffer."""
    storage = tensor.untyped_storage()
    ptr, nbytes = int(storage.data_ptr()), int(storage.nbytes())
    with _lock:
        if ptr in _registered:
            return True
        kv = module()
        try:
            fin = weakref.finalize(storage, _deregister, ptr, nbytes)
        except TypeError:
            return False  # no way to know when it is freed: leave it unregistered
        try:
            kv.memory_register(_DevicePtr(ptr, nbytes))
        except Exception:
            fin.detach()
            return False
        _registered[ptr] = fin
        return True


def registered_count() -> int:
    return len(_registered)


# --------------------------------------------------------------------------------------------
# transfers


def pread(
    filename: str, dest, offset: int, length: int, path: str, chunk: int, fallback: bool = False
) -> str:
    """Fill ``dest`` (a NumPy uint8 array or a CUDA uint8 tensor of ``length`` bytes) with the
    file's bytes [offset, offset+length), one KvikIO handle, tasks of ``chunk`` bytes. Returns
    the path used (see ``opened_or_posix`` for ``fallback``)."""
    if length == 0:
        return path
    with opened_or_posix(filename, "r", path, fallback) as (f, path):
        got = f.pread(dest, length, offset, task_size=chunk).get()
    if got < length:
        raise TruncatedFileError(
            f"{filename!r} ended at byte {offset + got} while reading up to byte "
            f"{offset + length}; the file was truncated (or is being rewritten)."
        )
    return path


def write_file(
    filename: str,
    size: int,
    segments: list,
    *,
    path: str,
    chunk: int,
    fsync: bool,
    header: Optional[bytes] = None,
    fallback: bool = False,
) -> tuple:
    """Write ``segments`` [(file_offset, nbytes, kind, src)] into a new file of ``size`` bytes
    (zeros elsewhere) through one KvikIO handle; ``header`` goes at offset 0 last, after an
    fsync of the rest, then the file is fsynced. Returns (path used, bytes moved per path)."""
    by_path: dict = {}
    with opened_or_posix(filename, "w", path, fallback) as (f, path):
        os.ftruncate(f.fileno(), size)
        futures = []
        for off, n, kind, src in segments:
            if n == 0:
                continue
            futures.append((n, off, f.pwrite(src[:n], n, off, task_size=chunk)))
            p = path if kind == "cuda" else "kvikio-posix"
            by_path[p] = by_path.get(p, 0) + n
        for n, off, fut in futures:
            done = fut.get()
            if done != n:
                raise OSError(f"KvikIO wrote {done} of {n} bytes at offset {off} of {filename!r}")
        if header is not None:
            if fsync:
                os.fsync(f.fileno())
            head = np.frombuffer(header, dtype=np.uint8)
            done = f.pwrite(head, head.size, 0).get()
            if done != head.size:
                raise OSError(f"KvikIO wrote {done} of {head.size} header bytes of {filename!r}")
        if fsync:
            os.fsync(f.fileno())
    return path, by_path


def timed():
    return time.perf_counter()
