"""The safetensors file format, read and written by millrace itself.

We produce the format ourselves rather than calling the ``safetensors`` library because the
writer must control the layout and the I/O: the header is padded so that tensor data starts on
a 4 KiB boundary (O_DIRECT and GPUDirect need aligned offsets), the data is written by many
threads in aligned chunks straight from pinned staging buffers, and the header is written
last, after an fsync, so that an interrupted save never looks like a valid file. The
``safetensors`` library is used in the tests as the independent reader of what we write.

Layout: 8-byte little-endian header length N, N bytes of JSON header (may end with spaces),
then the data buffer; each tensor has "dtype", "shape" and "data_offsets" [begin, end) into the
data buffer, the tensors cover the buffer contiguously with no gaps.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np

from . import _io
from .errors import DTypeMismatchError, FormatError, TruncatedFileError

# safetensors dtype -> (itemsize, numpy dtype or None when NumPy has none, torch dtype name)
DTYPES = {
    "F64": (8, np.float64, "float64"),
    "F32": (4, np.float32, "float32"),
    "F16": (2, np.float16, "float16"),
    "BF16": (2, None, "bfloat16"),
    "I64": (8, np.int64, "int64"),
    "I32": (4, np.int32, "int32"),
    "I16": (2, np.int16, "int16"),
    "I8": (1, np.int8, "int8"),
    "U64": (8, np.uint64, "uint64"),
    "U32": (4, np.uint32, "uint32"),
    "U16": (2, np.uint16, "uint16"),
    "U8": (1, np.uint8, "uint8"),
    "BOOL": (1, np.bool_, "bool"),
    "F8_E4M3": (1, None, "float8_e4m3fn"),
    "F8_E5M2": (1, None, "float8_e5m2"),
    "C64": (8, np.complex64, "complex64"),
}
_RAW_NP = {2: np.uint16, 1: np.uint8}
_NP_TO_ST = {np.dtype(v[1]): k for k, v in DTYPES.items() if v[1] is not None}
_TORCH_TO_ST = {v[2]: k for k, v in DTYPES.items()}
MAX_HEADER = 100 << 20


@dataclass
class TensorInfo:
    name: str
    dtype: str
    shape: tuple
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass
class Header:
    tensors: list
    metadata: Optional[dict]
    data_start: int  # file offset of the data buffer
    data_size: int


def st_dtype_of(obj) -> str:
    """The safetensors dtype name of a NumPy array or torch tensor."""
    if isinstance(obj, np.ndarray):
        st = _NP_TO_ST.get(obj.dtype)
        if st is None:
            raise DTypeMismatchError(
                f"NumPy dtype {obj.dtype} cannot be stored in safetensors; convert the array "
                "to one of " + ", ".join(sorted(str(k) for k in _NP_TO_ST)) + "."
            )
        return st
    name = str(obj.dtype).replace("torch.", "")
    st = _TORCH_TO_ST.get(name)
    if st is None:
        raise DTypeMismatchError(
            f"torch dtype {obj.dtype} cannot be stored in safetensors; convert the tensor first."
        )
    return st


def numpy_dtype(st: str, name: str) -> np.dtype:
    entry = DTYPES.get(st)
    if entry is None:
        raise FormatError(f"tensor {name!r} has unknown safetensors dtype {st!r}.")
    if entry[1] is None:
        raise DTypeMismatchError(
            f"tensor {name!r} is {st}, which NumPy has no dtype for; load it with torch "
            "installed (framework='torch'), or pass raw=True to get its bits as unsigned ints."
        )
    return np.dtype(entry[1])


def raw_numpy_dtype(st: str) -> np.dtype:
    entry = DTYPES[st]
    return np.dtype(entry[1]) if entry[1] is not None else np.dtype(_RAW_NP[entry[0]])


def torch_dtype(st: str):
    import torch

    return getattr(torch, DTYPES[st][2])


def build_header(entries: list, metadata: Optional[dict]) -> tuple[bytes, list]:
    """Lay out ``entries`` [(name, st_dtype, shape, nbytes)] and build the padded header.

    Tensors are ordered by item size (largest first), then name, as the safetensors library
    does, so every tensor starts aligned to its item size. Returns (header bytes including the
    8-byte length, [TensorInfo] in file order with offsets relative to the data buffer).
    """
    order = sorted(entries, key=lambda e: (-DTYPES[e[1]][0], e[0]))
    doc: dict = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("checkpoint metadata must map str to str.")
        doc["__metadata__"] = dict(metadata)
    infos = []
    pos = 0
    for name, st, shape, nbytes in order:
        doc[name] = {"dtype": st, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        infos.append(TensorInfo(name, st, tuple(shape), pos, pos + nbytes))
        pos += nbytes
    body = json.dumps(doc, separators=(",", ":")).encode()
    total = _io.round_up(8 + len(body))
    body += b" " * (total - 8 - len(body))
    return struct.pack("<Q", len(body)) + body, infos


def parse_header(f: _io.InputFile) -> Header:
    """Read and validate the header of an open safetensors file."""
    path = f.path
    if f.size < 8:
        raise TruncatedFileError(
            f"{path!r} is {f.size} bytes, too short to be a safetensors file (the 8-byte header "
            "length is missing); the file is truncated or is not safetensors."
        )
    first = np.empty(8, dtype=np.uint8)
    f.pread_into(first, 0)
    (n,) = struct.unpack("<Q", first.tobytes())
    if n == 0 or n > MAX_HEADER:
        raise FormatError(
            f"{path!r} does not start with a valid safetensors header (header length {n}); it "
            "is not a safetensors file, or an interrupted save left it incomplete."
        )
    if 8 + n > f.size:
        raise TruncatedFileError(
            f"{path!r} is truncated: its header claims {n} bytes but the file has only "
            f"{f.size}. Re-copy or re-save it."
        )
    raw = np.empty(n, dtype=np.uint8)
    f.pread_into(raw, 8)
    try:
        doc = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(
            f"{path!r} has a corrupt safetensors header ({e}); re-copy or re-save the file."
        ) from e
    if not isinstance(doc, dict):
        raise FormatError(f"{path!r} has a safetensors header that is not a JSON object.")
    metadata = doc.pop("__metadata__", None)
    tensors = []
    for name, d in doc.items():
        try:
            st = d["dtype"]
            shape = tuple(int(x) for x in d["shape"])
            begin, end = (int(x) for x in d["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise FormatError(f"{path!r}: tensor {name!r} has a malformed header entry.") from e
        if st not in DTYPES:
            raise FormatError(f"{path!r}: tensor {name!r} has unknown dtype {st!r}.")
        want = int(np.prod(shape, dtype=np.int64)) * DTYPES[st][0]
        if end - begin != want or begin < 0:
            raise FormatError(
                f"{path!r}: tensor {name!r} ({st}, shape {list(shape)}) should take {want} "
                f"bytes but its offsets {begin}..{end} give {end - begin}; the file is corrupt."
            )
        tensors.append(TensorInfo(name, st, shape, begin, end))
    tensors.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in tensors:
        if t.begin != pos:
            raise FormatError(
                f"{path!r}: tensor {t.name!r} starts at {t.begin}, expected {pos}; the data "
                "offsets have gaps or overlaps, so the file is corrupt."
            )
        pos = t.end
    data_start = 8 + n
    if data_start + pos > f.size:
        raise TruncatedFileError(
            f"{path!r} is truncated: its header declares {pos} bytes of tensor data but only "
            f"{f.size - data_start} follow the header. Re-copy or re-save the file."
        )
    return Header(tensors, metadata, data_start, pos)
