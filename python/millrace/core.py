"""``read`` and ``write``: whole files (or byte ranges) between storage and host or GPU memory."""

from __future__ import annotations

import bisect
import contextlib
import os
import time
import uuid
from typing import Any, Optional

import numpy as np

from . import _gpu, _io, _kvikio
from .errors import TruncatedFileError


def read(
    path,
    device="cpu",
    *,
    offset: int = 0,
    length: Optional[int] = None,
    threads: Optional[int] = None,
    chunk: int = _io.DEFAULT_CHUNK,
    via: Optional[str] = None,
    gds: Optional[bool] = None,
    direct: Optional[bool] = None,
):
    """Read a file (or ``length`` bytes at ``offset``) as a flat uint8 buffer.

    ``device="cpu"`` gives a NumPy array; ``device="cuda[:N]"`` gives a torch uint8 tensor in GPU
    memory. ``via`` picks the path (see ``millrace._kvikio``): None reads ``MILLRACE_GPU_PATH``,
    else "auto": KvikIO for GPU memory where it works (GDS, cuFile's compat mode or KvikIO's
    POSIX path, as KvikIO says), millrace's own O_DIRECT threads (``cpu``) for host memory and
    without KvikIO. "gds", "cufile-compat", "kvikio-posix", "cpu" force one, and raise
    DeviceUnavailableError where it cannot run. ``millrace.last_transfer()`` says which ran.
    ``gds=True``/``False`` is the older spelling of via="cufile"/"cpu".
    """
    dev = _gpu.check_device(device)
    if offset < 0 or (length is not None and length < 0):
        raise ValueError("offset and length must not be negative.")
    route = _kvikio.plan(_via(via, gds), dev is not None)
    t0 = time.perf_counter()
    if route != "cpu":
        path = _io.check_path(os.fspath(path))
        size = os.path.getsize(path)
        length = _check_range(path, size, offset, length)
        _kvikio.configure(_io.default_threads(threads), chunk)
        if dev is None:
            dest = _io.aligned_empty(length)
        else:
            torch = _gpu.torch_module()
            dest = torch.empty(length, dtype=torch.uint8, device=dev)
        auto = _kvikio.requested(_via(via, gds)) == "auto"
        route = _kvikio.pread(path, dest, offset, length, route, chunk, fallback=auto)
        _kvikio.record("read", route, length, time.perf_counter() - t0)
        return dest
    with _io.InputFile(path, direct) as f:
        length = _check_range(f.path, f.size, offset, length)
        if dev is None:
            out = _io.read_range_host(f, offset, length, threads, chunk)
        else:
            torch = _gpu.torch_module()
            out = torch.empty(length, dtype=torch.uint8, device=dev)
            _gpu.read_to_device(f, offset, length, out, threads, chunk)
    _kvikio.record("read", "cpu", length, time.perf_counter() - t0)
    return out


def _via(via: Optional[str], gds: Optional[bool]) -> Optional[str]:
    if gds is None or via is not None:
        return via
    return "cufile" if gds else "cpu"


def _check_range(path: str, size: int, offset: int, length: Optional[int]) -> int:
    if length is None:
        if offset > size:
            raise ValueError(f"offset {offset} is past the end of {path!r} ({size} bytes).")
        return size - offset
    if offset + length > size:
        raise TruncatedFileError(
            f"{path!r} has {size} bytes but bytes {offset}..{offset + length} were asked "
            "for; the file is truncated or the request is wrong."
        )
    return length


def as_bytes_source(data) -> tuple[int, Any]:
    """(nbytes, copier) for a NumPy array, bytes-like, or torch tensor on any device.

    ``copier(dst_uint8_array, src_offset, worker_tensor_map)`` copies bytes from the source.
    """
    torch = _gpu.torch_module()
    if torch is not None and isinstance(data, torch.Tensor):
        flat = _gpu.tensor_bytes(data)
        if flat.is_cuda:
            return flat.numel(), ("cuda", flat)
        return flat.numel(), ("host", flat.numpy())
    if isinstance(data, np.ndarray):
        arr = np.ascontiguousarray(data)
        return arr.nbytes, ("host", arr.reshape(-1).view(np.uint8))
    try:
        mv = memoryview(data).cast("B")
    except TypeError as e:
        raise TypeError(
            f"cannot write an object of type {type(data).__name__}; pass a NumPy array, a "
            "torch tensor, or a bytes-like object."
        ) from e
    return mv.nbytes, ("host", np.frombuffer(mv, dtype=np.uint8))


def write(
    path,
    data,
    *,
    threads: Optional[int] = None,
    chunk: int = _io.DEFAULT_CHUNK,
    fsync: bool = True,
    atomic: bool = True,
    direct: Optional[bool] = None,
    via: Optional[str] = None,
) -> int:
    """Write the bytes of ``data`` (NumPy array, torch tensor on any device, bytes) to ``path``.

    Parallel aligned writes (O_DIRECT where allowed), then fsync. With ``atomic=True`` the data
    goes to a temporary file in the same directory that is renamed over ``path`` only once it
    is complete and durable. Returns the number of bytes written. ``via`` picks the path as in
    ``read``: a CUDA tensor goes through KvikIO (GDS where KvikIO says it is available) by
    default where KvikIO works, host memory through millrace's own threads.
    """
    path = os.fspath(path)
    nbytes, (kind, src) = as_bytes_source(data)
    segments = [(0, nbytes, kind, src)]
    write_segments(
        path,
        nbytes,
        segments,
        threads=threads,
        chunk=chunk,
        fsync=fsync,
        atomic=atomic,
        direct=direct,
        via=via,
        op="write",
    )
    return nbytes


def write_segments(
    path: str,
    size: int,
    segments: list,
    *,
    threads: Optional[int],
    chunk: int,
    fsync: bool,
    atomic: bool,
    direct: Optional[bool],
    header: Optional[bytes] = None,
    via: Optional[str] = None,
    op: str = "write",
    register: tuple = (),
) -> str:
    """Write a file made of ``segments`` [(file_offset, nbytes, kind, src)] and zeros elsewhere.

    If ``header`` is given it is written at offset 0 last, after the rest is fsynced, so a crash
    can only leave a file whose header is still zero (which no reader accepts). Returns the
    path that moved the bytes (GPU memory's where there was any). ``register``: CUDA tensors to
    register with cuFile once (written again and again: a model's parameters) on the gds path.
    """
    threads = _io.default_threads(threads)
    t0 = time.perf_counter()
    segments = sorted(segments, key=lambda s: s[0])
    starts = [s[0] for s in segments]
    has_cuda = any(s[2] == "cuda" for s in segments)
    _check_directory(path)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}" if atomic else path
    route = _kvikio.plan(via, has_cuda)
    if route != "cpu":
        kv = dict(chunk=chunk, fsync=fsync, atomic=atomic, header=header, via=via, op=op)
        return _write_through_kvikio(
            path, tmp, size, segments, route, has_cuda, threads, register, t0, **kv
        )
    out = _io.OutputFile(tmp, size, direct)
    streams: dict = {}
    torch = _gpu.torch_module() if has_cuda else None
    make_staging, tensor_of = _gpu.pinned_staging(threads) if has_cuda else (None, {})

    def fill(buf: np.ndarray, file_off: int, w: int) -> None:
        end = file_off + buf.shape[0]
        i = max(0, bisect.bisect_right(starts, file_off) - 1)
        pos = file_off
        pending = False
        while pos < end:
            if i >= len(segments):
                buf[pos - file_off :] = 0
                break
            s_off, s_len, kind, src = segments[i]
            if pos < s_off:
                stop = min(end, s_off)
                buf[pos - file_off : stop - file_off] = 0
                pos = stop
                continue
            if pos >= s_off + s_len:
                i += 1
                continue
            stop = min(end, s_off + s_len)
            a, b = pos - s_off, stop - s_off
            if kind == "host":
                np.copyto(buf[pos - file_off : stop - file_off], src[a:b])
            else:
                stream = streams.get(w)
                if stream is None:
                    stream = streams[w] = torch.cuda.Stream(src.device)
                staging = tensor_of[buf.ctypes.data]
                lo = pos - file_off
                with torch.cuda.stream(stream):
                    staging[lo : lo + (b - a)].copy_(src[a:b], non_blocking=True)
                pending = True
            pos = stop
        if pending:
            streams[w].synchronize()

    try:
        if has_cuda:
            torch.cuda.synchronize()
        data_start = 0 if header is None else len(header)
        if data_start % _io.ALIGN:
            raise AssertionError("the header must fill whole alignment blocks")
        _io.write_parallel(out, data_start, size, fill, threads, chunk, make_staging)
        if header is not None:
            _write_header(out, header, fsync)
        out.finish(fsync)
        out.close()
        if atomic:
            os.replace(tmp, path)
            if fsync:
                _io.fsync_dir(path)
    except BaseException:
        out.close()
        if atomic:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    _kvikio.record(op, "cpu", sum(s[1] for s in segments), time.perf_counter() - t0)
    return "cpu"


def _write_through_kvikio(
    path: str,
    tmp: str,
    size: int,
    segments: list,
    route: str,
    has_cuda: bool,
    threads: int,
    register: tuple,
    t0: float,
    *,
    chunk: int,
    fsync: bool,
    atomic: bool,
    header: Optional[bytes],
    via: Optional[str],
    op: str,
) -> str:
    """``write_segments`` on a KvikIO path: one handle, then the same rename as the CPU path."""
    _kvikio.configure(threads, chunk)
    if has_cuda:
        torch = _gpu.torch_module()
        torch.cuda.synchronize()
        if route == "gds":
            for t in register:
                _kvikio.register_once(t)
    try:
        route, by_path = _kvikio.write_file(
            tmp,
            size,
            segments,
            path=route,
            chunk=chunk,
            fsync=fsync,
            header=header,
            fallback=_kvikio.requested(via) == "auto",
        )
        if atomic:
            os.replace(tmp, path)
            if fsync:
                _io.fsync_dir(path)
    except BaseException:
        if atomic:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    moved = sum(by_path.values())
    _kvikio.record(op, route, moved, time.perf_counter() - t0, **by_path)
    return route


def _check_directory(path: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            2,
            f"directory {directory!r} does not exist; create it before writing into it.",
            directory,
        )


def _write_header(out, header: bytes, fsync: bool) -> None:
    """The header goes last, after the data is on disk: a crash leaves a zero header."""
    if fsync:
        os.fsync(out.fd_buffered)
    head = _io.aligned_empty(len(header))
    head[:] = np.frombuffer(header, dtype=np.uint8)
    out.pwrite_all(head, 0)
