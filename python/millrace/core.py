"""``read`` and ``write``: whole files (or byte ranges) between storage and host or GPU memory."""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Any, Optional

import numpy as np

from . import _gpu, _io


def read(
    path,
    device="cpu",
    *,
    offset: int = 0,
    length: Optional[int] = None,
    threads: Optional[int] = None,
    chunk: int = _io.DEFAULT_CHUNK,
    gds: Optional[bool] = None,
    direct: Optional[bool] = None,
):
    """Read a file (or ``length`` bytes at ``offset``) as a flat uint8 buffer.

    ``device="cpu"`` gives a NumPy array; ``device="cuda[:N]"`` gives a torch uint8 tensor in GPU
    memory. Reads are parallel (``threads``), ``chunk``-sized, aligned and O_DIRECT where the
    filesystem allows. On a GPU, ``gds=None`` uses GPUDirect Storage when it runs natively and
    the pinned-buffer pipeline otherwise; ``gds=True`` forces cuFile, ``gds=False`` forbids it.
    """
    dev = _gpu.check_device(device)
    if offset < 0 or (length is not None and length < 0):
        raise ValueError("offset and length must not be negative.")
    with _io.InputFile(path, direct) as f:
        if length is None:
            if offset > f.size:
                raise ValueError(f"offset {offset} is past the end of {f.path!r} ({f.size} bytes).")
            length = f.size - offset
        if dev is None:
            return _io.read_range_host(f, offset, length, threads, chunk)
        torch = _gpu.torch_module()
        dest = torch.empty(length, dtype=torch.uint8, device=dev)
        _gpu.read_to_device(f, offset, length, dest, threads, chunk, _gpu.use_gds(gds), gds is True)
        return dest


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
) -> int:
    """Write the bytes of ``data`` (NumPy array, torch tensor on any device, bytes) to ``path``.

    Parallel aligned writes (O_DIRECT where allowed), then fsync. With ``atomic=True`` the data
    goes to a temporary file in the same directory that is renamed over ``path`` only once it
    is complete and durable. Returns the number of bytes written.
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
) -> None:
    """Write a file made of ``segments`` [(file_offset, nbytes, kind, src)] and zeros elsewhere.

    If ``header`` is given it is written at offset 0 last, after the rest is fsynced, so a crash
    can only leave a file whose header is still zero (which no reader accepts).
    """
    threads = _io.default_threads(threads)
    segments = sorted(segments, key=lambda s: s[0])
    starts = [s[0] for s in segments]
    has_cuda = any(s[2] == "cuda" for s in segments)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            2,
            f"directory {directory!r} does not exist; create it before writing into it.",
            directory,
        )
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}" if atomic else path
    out = _io.OutputFile(tmp, size, direct)
    make_staging = None
    tensor_of: dict = {}
    streams: dict = {}
    if has_cuda:
        torch = _gpu.torch_module()
        make_staging, tensor_of = _gpu.pinned_staging(threads)
    import bisect

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
        data_start = 0
        if header is not None:
            data_start = len(header)
            if data_start % _io.ALIGN:
                raise AssertionError("the header must fill whole alignment blocks")
        _io.write_parallel(out, data_start, size, fill, threads, chunk, make_staging)
        if header is not None:
            if fsync:
                os.fsync(out.fd_buffered)
            head = _io.aligned_empty(data_start)
            head[:] = np.frombuffer(header, dtype=np.uint8)
            out.pwrite_all(head, 0)
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
