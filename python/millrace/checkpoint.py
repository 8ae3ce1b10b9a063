"""Checkpoints as safetensors files, saved and loaded in parallel, crash-safe."""

from __future__ import annotations

import os
import time
from typing import Mapping, Optional

import numpy as np

from . import _gpu, _io, _kvikio, _safetensors
from .core import _via, write_segments
from .errors import DTypeMismatchError

CKPT_CHUNK = 8 << 20
CKPT_THREADS = 8


def save_checkpoint(
    state_dict: Mapping,
    path,
    *,
    metadata: Optional[Mapping[str, str]] = None,
    threads: Optional[int] = CKPT_THREADS,
    chunk: int = CKPT_CHUNK,
    fsync: bool = True,
    direct: Optional[bool] = None,
    via: Optional[str] = None,
) -> int:
    """Save a state dict of torch tensors (any device) or NumPy arrays as a safetensors file.

    The file is written in parallel into a temporary file next to ``path``: tensor data first,
    fsync, then the header, fsync, then an atomic rename over ``path`` and an fsync of the
    directory. A crash at any point leaves either the old file at ``path`` or the complete new
    one; the temporary file never has a valid header before all its data is durable.
    Returns the file size in bytes.

    ``via`` picks the path (as ``millrace.read``): by default GPU tensors are written straight
    from GPU memory through KvikIO where it works (GDS where KvikIO says it is available, the
    tensors' allocations registered with cuFile once and kept registered while they live),
    through one file handle for the whole file. ``millrace.last_transfer()`` says which ran.
    """
    path = os.fspath(path)
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"save_checkpoint needs a mapping of names to tensors, got {type(state_dict).__name__}."
        )
    torch = _gpu.torch_module()
    entries, sources, reused = [], {}, []
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"state dict keys must be str, got {name!r}.")
        if torch is not None and isinstance(value, torch.Tensor):
            if value.is_sparse or value.layout != torch.strided:
                raise TypeError(f"tensor {name!r} is sparse; call .to_dense() before saving it.")
            flat = _gpu.tensor_bytes(value)
            src = ("cuda", flat) if flat.is_cuda else ("host", flat.numpy())
            if flat.is_cuda and value.is_contiguous():
                reused.append(value)  # its memory is written again at the next save
            shape = tuple(value.shape)
        elif isinstance(value, np.ndarray):
            arr = value if value.flags.c_contiguous else value.copy(order="C")
            if arr.dtype.byteorder == ">":
                arr = arr.astype(arr.dtype.newbyteorder("<"))
            src = ("host", arr.reshape(-1).view(np.uint8))
            shape = arr.shape
            value = arr
        else:
            raise TypeError(
                f"state dict entry {name!r} is a {type(value).__name__}; save_checkpoint takes "
                "torch tensors or NumPy arrays."
            )
        st = _safetensors.st_dtype_of(value)
        nbytes = int(np.prod(shape, dtype=np.int64)) * _safetensors.DTYPES[st][0]
        entries.append((name, st, shape, nbytes))
        sources[name] = src
    header, infos = _safetensors.build_header(entries, dict(metadata) if metadata else None)
    base = len(header)
    segments = []
    for t in infos:
        if t.nbytes:
            kind, src = sources[t.name]
            segments.append((base + t.begin, t.nbytes, kind, src))
    size = base + (infos[-1].end if infos else 0)
    write_segments(
        path,
        size,
        segments,
        threads=threads,
        chunk=chunk,
        fsync=fsync,
        atomic=True,
        direct=direct,
        header=header,
        via=via,
        op="save",
        register=tuple(reused),
    )
    return size


def load_checkpoint(
    path,
    device="cpu",
    *,
    framework: Optional[str] = None,
    raw: bool = False,
    threads: Optional[int] = CKPT_THREADS,
    chunk: int = CKPT_CHUNK,
    gds: Optional[bool] = None,
    direct: Optional[bool] = None,
    via: Optional[str] = None,
) -> dict:
    """Load a safetensors file into a dict of tensors.

    ``framework`` is "torch" or "numpy"; by default torch when it is installed, else NumPy.
    ``device="cuda"`` needs torch and puts every tensor in GPU memory (one parallel read of the
    whole data buffer, then views). ``raw=True`` (NumPy only) returns dtypes NumPy lacks
    (bfloat16, float8) as unsigned integers of the same width. ``via`` picks the path as in
    ``millrace.read`` (``gds`` is its older spelling); the whole data buffer is read with one
    handle.
    """
    dev = _gpu.check_device(device)
    torch = _gpu.torch_module()
    if framework is None:
        framework = "torch" if torch is not None else "numpy"
    if framework not in ("torch", "numpy"):
        raise ValueError(f"framework must be 'torch' or 'numpy', got {framework!r}.")
    if framework == "torch" and torch is None:
        raise ImportError("framework='torch' needs PyTorch; install torch or use 'numpy'.")
    if dev is not None and framework == "numpy":
        raise ValueError("device='cuda' gives torch tensors; use framework='torch' (or None).")
    route = _kvikio.plan(_via(via, gds), dev is not None)
    t0 = time.perf_counter()
    with _io.InputFile(path, direct) as f:
        h = _safetensors.parse_header(f)
        if route != "cpu":
            f.close()  # the data is read through one KvikIO handle
            _kvikio.configure(_io.default_threads(threads), chunk)
            if dev is None:
                data = _io.aligned_empty(h.data_size)
            else:
                data = torch.empty(h.data_size, dtype=torch.uint8, device=dev)
            auto = _kvikio.requested(_via(via, gds)) == "auto"
            route = _kvikio.pread(f.path, data, h.data_start, h.data_size, route, chunk, auto)
        elif dev is None:
            data = _io.read_range_host(f, h.data_start, h.data_size, threads, chunk)
        else:
            data = torch.empty(h.data_size, dtype=torch.uint8, device=dev)
            _gpu.read_to_device(f, h.data_start, h.data_size, data, threads, chunk)
    _kvikio.record("load", route, h.data_size, time.perf_counter() - t0)
    if dev is not None:
        out = {t.name: _view_torch(data[t.begin : t.end], t) for t in h.tensors}
        return _in_header_order(out, h)
    out = {}
    for t in h.tensors:
        part = data[t.begin : t.end]
        if framework == "numpy":
            dt = (
                _safetensors.raw_numpy_dtype(t.dtype)
                if raw
                else _safetensors.numpy_dtype(t.dtype, t.name)
            )
            out[t.name] = _view_np(part, dt, t.shape)
        else:
            u8 = torch.from_numpy(part) if part.size else torch.empty(0, dtype=torch.uint8)
            out[t.name] = _view_torch(u8, t)
    return _in_header_order(out, h)


def _in_header_order(out: dict, h) -> dict:
    return {t.name: out[t.name] for t in sorted(h.tensors, key=lambda t: t.name)}


def _view_np(part: np.ndarray, dt: np.dtype, shape: tuple) -> np.ndarray:
    if part.ctypes.data % dt.itemsize:
        part = part.copy()
    return part.view(dt).reshape(shape)


def _view_torch(u8, t):
    torch = _gpu.torch_module()
    dtype = _safetensors.torch_dtype(t.dtype)
    item = _safetensors.DTYPES[t.dtype][0]
    if u8.numel() == 0:
        return torch.empty(t.shape, dtype=dtype, device=u8.device)
    if u8.data_ptr() % item:
        u8 = u8.clone()
    try:
        return u8.view(dtype).reshape(t.shape)
    except RuntimeError as e:
        raise DTypeMismatchError(f"tensor {t.name!r} cannot be viewed as {dtype}: {e}") from e
