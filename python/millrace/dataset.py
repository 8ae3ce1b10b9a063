"""ShardDataset: batches from shard files (safetensors, .npy, raw records) on the CPU or a GPU."""

from __future__ import annotations

import glob
import os
import queue
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from . import _gpu, _io, _safetensors
from .errors import DTypeMismatchError, FormatError, MillraceError, TruncatedFileError

_torch = _gpu.torch_module()
if _torch is not None:
    from torch.utils.data import IterableDataset as _Base
else:  # pragma: no cover - exercised only without torch

    class _Base:  # type: ignore[no-redef]
        pass


@dataclass
class _Field:
    name: Optional[str]  # None for .npy / raw shards (one unnamed array per sample)
    dtype: str  # safetensors dtype name, or a NumPy dtype string
    np_dtype: np.dtype  # what the bytes are held as on the host
    sample_shape: tuple
    offset: int  # file offset of sample 0
    sample_bytes: int


@dataclass
class _Shard:
    path: str
    size: int
    n: int
    fields: list


def _expand(shards) -> list:
    if isinstance(shards, (str, os.PathLike)):
        shards = [shards]
    paths: list = []
    for s in shards:
        s = os.fspath(s)
        if glob.has_magic(s):
            found = sorted(glob.glob(s))
            if not found:
                raise FileNotFoundError(
                    2, f"no files match {s!r}; check the pattern and that the share is mounted.", s
                )
            paths += found
        else:
            paths.append(_io.check_path(s))
    if not paths:
        raise ValueError("ShardDataset needs at least one shard file.")
    return paths


def _np_dtype_name(dt: np.dtype) -> str:
    return np.dtype(dt).str


class ShardDataset(_Base):
    """Batches of samples from a set of shard files, prefetched, shuffled and split by rank.

    Each shard holds ``n`` samples: for safetensors every tensor's first dimension is the sample
    index (all tensors of a shard share it, and a batch is a dict of them); for ``.npy`` the
    array's first dimension; for any other file fixed-size records of ``record_dtype`` and
    ``record_shape`` (``record_dtype`` defaults to uint8 with ``record_shape=(record_bytes,)``).

    Each epoch with ``shuffle=True`` the shard order is permuted and the samples of every group
    of ``mix_shards`` consecutive shards are permuted together, so samples mix across and within
    shards while only a few shards need to be in memory; the order depends only on ``seed`` and
    the epoch. Rank ``r`` of ``world_size`` gets samples ``r, r + world_size, ...`` of that
    order: the ranks' shares are disjoint and together cover every sample exactly once
    (``equal_shares=True`` drops up to ``world_size - 1`` samples per epoch so that every rank
    gets the same count, which DistributedDataParallel needs).

    Iterate it directly or wrap it in ``torch.utils.data.DataLoader(ds, batch_size=None)``; it
    prefetches ``prefetch`` shards and batches on its own threads, so use ``num_workers=0``
    with ``device="cuda"``. Each new iteration advances the epoch; ``set_epoch`` sets it.
    """

    def __init__(
        self,
        shards: Union[str, Sequence[str]],
        *,
        device="cpu",
        batch_size: Optional[int] = None,
        shuffle: bool = False,
        seed: int = 0,
        prefetch: int = 2,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        equal_shares: bool = False,
        mix_shards: int = 4,
        dtype=None,
        record_dtype=None,
        record_shape: Optional[Sequence[int]] = None,
        record_bytes: Optional[int] = None,
        threads: Optional[int] = None,
    ):
        self.device = _gpu.check_device(device)
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer or None, got {batch_size}.")
        if prefetch < 1 or mix_shards < 1:
            raise ValueError("prefetch and mix_shards must be at least 1.")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.prefetch = int(prefetch)
        self.drop_last = drop_last
        self.equal_shares = equal_shares
        self.mix_shards = int(mix_shards)
        self.threads = threads
        self.epoch = 0
        self.rank, self.world_size = _rank_world(rank, world_size)
        self._expect_dtype = None if dtype is None else np.dtype(dtype)
        self._record = _record_layout(record_dtype, record_shape, record_bytes)
        self.paths = _expand(shards)
        self.shards = [self._open_shard(p) for p in self.paths]
        self._check_consistent()
        counts = np.array([s.n for s in self.shards], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_samples = int(self._starts[-1])

    # ---------------------------------------------------------------- shard inspection

    def _open_shard(self, path: str) -> _Shard:
        with _io.InputFile(path, direct=False) as f:
            if path.endswith(".safetensors"):
                return self._open_safetensors(f)
            if path.endswith(".npy"):
                return self._open_npy(f)
            return self._open_raw(f)

    def _open_safetensors(self, f: _io.InputFile) -> _Shard:
        h = _safetensors.parse_header(f)
        if not h.tensors:
            raise FormatError(f"shard {f.path!r} holds no tensors; remove it from the list.")
        ns = {t.name: (t.shape[0] if t.shape else None) for t in h.tensors}
        if None in ns.values() or len(set(ns.values())) != 1:
            raise FormatError(
                f"shard {f.path!r}: every tensor must have the sample index as its first "
                f"dimension with the same length, but the first dimensions are {ns}."
            )
        n = next(iter(ns.values()))
        fields = []
        for t in sorted(h.tensors, key=lambda t: t.name):
            item = _safetensors.DTYPES[t.dtype][0]
            sample_shape = tuple(t.shape[1:])
            sbytes = int(np.prod(sample_shape, dtype=np.int64)) * item
            if self._expect_dtype is not None:
                have = _safetensors.DTYPES[t.dtype][1]
                if have is None or np.dtype(have) != self._expect_dtype:
                    raise DTypeMismatchError(
                        f"shard {f.path!r}: tensor {t.name!r} is {t.dtype} but dtype="
                        f"{self._expect_dtype} was asked for; convert the shard or change dtype."
                    )
            fields.append(
                _Field(
                    t.name,
                    t.dtype,
                    _safetensors.raw_numpy_dtype(t.dtype),
                    sample_shape,
                    h.data_start + t.begin,
                    sbytes,
                )
            )
        return _Shard(f.path, f.size, n, fields)

    def _open_npy(self, f: _io.InputFile) -> _Shard:
        from numpy.lib import format as npformat

        with open(f.path, "rb") as fh:
            try:
                version = npformat.read_magic(fh)
                reader = {
                    (1, 0): npformat.read_array_header_1_0,
                    (2, 0): npformat.read_array_header_2_0,
                }.get(version)
                if reader is None:
                    raise ValueError(f"unsupported .npy version {version}")
                shape, fortran, dt = reader(fh)
            except ValueError as e:
                raise FormatError(
                    f"shard {f.path!r} is not a valid .npy file ({e}); re-create it with "
                    "numpy.save."
                ) from e
            offset = fh.tell()
        if fortran and len(shape) > 1:
            raise FormatError(
                f"shard {f.path!r} is stored in Fortran order; save it C-contiguous "
                "(numpy.save(np.ascontiguousarray(a)))."
            )
        if dt.hasobject:
            raise FormatError(f"shard {f.path!r} holds Python objects, which cannot be read.")
        if not shape:
            raise FormatError(f"shard {f.path!r} is a 0-d array; shards need a sample dimension.")
        if self._expect_dtype is not None and dt != self._expect_dtype:
            raise DTypeMismatchError(
                f"shard {f.path!r} holds {dt} but dtype={self._expect_dtype} was asked for; "
                "convert the shard or change dtype."
            )
        sbytes = int(np.prod(shape[1:], dtype=np.int64)) * dt.itemsize
        need = offset + shape[0] * sbytes
        if need > f.size:
            raise TruncatedFileError(
                f"shard {f.path!r} is truncated: its header declares {shape[0]} samples "
                f"({need} bytes) but the file has {f.size} bytes. Re-copy or re-create it."
            )
        field = _Field(None, _np_dtype_name(dt), dt, tuple(shape[1:]), offset, sbytes)
        return _Shard(f.path, f.size, int(shape[0]), [field])

    def _open_raw(self, f: _io.InputFile) -> _Shard:
        if self._record is None:
            raise ValueError(
                f"shard {f.path!r} is neither .safetensors nor .npy; pass record_bytes= (or "
                "record_dtype= and record_shape=) to read it as fixed-size records."
            )
        dt, shape = self._record
        if self._expect_dtype is not None and dt != self._expect_dtype:
            raise DTypeMismatchError(
                f"record_dtype={dt} and dtype={self._expect_dtype} disagree; pass one of them."
            )
        sbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if f.size % sbytes:
            raise TruncatedFileError(
                f"shard {f.path!r} has {f.size} bytes, not a whole number of {sbytes}-byte "
                "records; it is truncated or the record size is wrong."
            )
        field = _Field(None, _np_dtype_name(dt), dt, tuple(shape), 0, sbytes)
        return _Shard(f.path, f.size, f.size // sbytes, [field])

    def _check_consistent(self) -> None:
        first = self.shards[0]
        sig0 = [(x.name, x.dtype, x.sample_shape) for x in first.fields]
        for s in self.shards[1:]:
            sig = [(x.name, x.dtype, x.sample_shape) for x in s.fields]
            if sig != sig0:
                raise DTypeMismatchError(
                    f"shard {s.path!r} has fields {sig} but {first.path!r} has {sig0}; all "
                    "shards must hold the same names, dtypes and per-sample shapes."
                )

    # ---------------------------------------------------------------- order and shares

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch`` for the next iteration (as with DistributedSampler.set_epoch)."""
        self.epoch = int(epoch)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """Global sample indices in the order of ``epoch`` (the same on every rank)."""
        if not self.shuffle:
            return np.arange(self.num_samples, dtype=np.int64)
        rng = np.random.default_rng([self.seed, int(epoch)])
        perm = rng.permutation(len(self.shards))
        parts = []
        for w in range(0, len(perm), self.mix_shards):
            group = perm[w : w + self.mix_shards]
            idx = np.concatenate(
                [np.arange(self._starts[s], self._starts[s + 1], dtype=np.int64) for s in group]
            )
            rng.shuffle(idx)
            parts.append(idx)
        return np.concatenate(parts)

    def rank_indices(self, epoch: int, rank: Optional[int] = None) -> np.ndarray:
        """The global sample indices rank ``rank`` (default: this one) reads in ``epoch``."""
        order = self.epoch_order(epoch)
        if self.equal_shares:
            order = order[: len(order) - len(order) % self.world_size]
        return order[self.rank if rank is None else rank :: self.world_size]

    def _batches(self, epoch: int) -> list:
        idx = self.rank_indices(epoch)
        if self.batch_size is None:
            return [idx[i : i + 1] for i in range(len(idx))]
        b = self.batch_size
        out = [idx[i : i + b] for i in range(0, len(idx), b)]
        if out and self.drop_last and len(out[-1]) < b:
            out.pop()
        return out

    def __len__(self) -> int:
        """Batches (or samples, with batch_size=None) this rank yields per epoch."""
        n = len(self.rank_indices(0)) if self.world_size > 1 else self.num_samples
        if self.batch_size is None:
            return n
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    # ---------------------------------------------------------------- reading

    def _load_shard(self, si: int) -> list:
        s = self.shards[si]
        lo = min(x.offset for x in s.fields)
        hi = max(x.offset + x.sample_bytes * s.n for x in s.fields)
        with _io.InputFile(s.path) as f:
            if f.size != s.size:
                raise TruncatedFileError(
                    f"shard {s.path!r} changed size from {s.size} to {f.size} bytes since the "
                    "dataset was opened; re-create the dataset after rewriting shards."
                )
            data = _io.read_range_host(f, lo, hi - lo, self.threads)
        arrays = []
        for x in s.fields:
            part = data[x.offset - lo : x.offset - lo + x.sample_bytes * s.n]
            if part.ctypes.data % x.np_dtype.itemsize:
                part = part.copy()
            arrays.append(part.view(x.np_dtype).reshape((s.n, *x.sample_shape)))
        return arrays

    def sample(self, index: int):
        """One sample by global index, read on its own (NumPy on the host)."""
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} is out of range (0..{self.num_samples - 1}).")
        si = int(np.searchsorted(self._starts, index, side="right") - 1)
        local = index - int(self._starts[si])
        s = self.shards[si]
        out = []
        with _io.InputFile(s.path, direct=False) as f:
            for x in s.fields:
                buf = np.empty(x.sample_bytes, dtype=np.uint8)
                got = f.pread_into(buf, x.offset + local * x.sample_bytes)
                if got < x.sample_bytes:
                    raise TruncatedFileError(
                        f"shard {s.path!r} ended before sample {local}; it was truncated."
                    )
                out.append(buf.view(x.np_dtype).reshape(x.sample_shape))
        return self._package(out, batched=False)

    def _package(self, arrays: list, batched: bool):
        fields = self.shards[0].fields
        if self.device is not None or any(
            _safetensors.DTYPES.get(x.dtype, (0, 1))[1] is None for x in fields
        ):
            arrays = [self._to_torch(a, x) for a, x in zip(arrays, fields)]
        if fields[0].name is None:
            return arrays[0]
        return {x.name: a for a, x in zip(arrays, fields)}

    def _to_torch(self, a, x: _Field):
        torch = _gpu.torch_module()
        if torch is None:
            raise DTypeMismatchError(
                f"field {x.name!r} is {x.dtype}, which NumPy has no dtype for; install torch."
            )
        if isinstance(a, np.ndarray):
            a = torch.from_numpy(a)
        if x.dtype in _safetensors.DTYPES and _safetensors.DTYPES[x.dtype][1] is None:
            a = a.view(_safetensors.torch_dtype(x.dtype))
        return a

    def __iter__(self) -> Iterator[Any]:
        info = _torch.utils.data.get_worker_info() if _torch is not None else None
        if info is not None and self.device is not None:
            raise MillraceError(
                "ShardDataset with device='cuda' cannot run in DataLoader worker processes "
                "(CUDA does not survive fork); use num_workers=0, the dataset prefetches on its "
                "own threads."
            )
        epoch = self.epoch
        self.epoch += 1
        batches = self._batches(epoch)
        if info is not None:
            batches = batches[info.id :: info.num_workers]
        return _Prefetcher(self, batches)


def _rank_world(rank, world_size) -> tuple:
    if rank is None or world_size is None:
        r, w = 0, 1
        dist = getattr(_torch, "distributed", None) if _torch is not None else None
        if dist is not None and dist.is_available() and dist.is_initialized():
            r, w = dist.get_rank(), dist.get_world_size()
        elif "WORLD_SIZE" in os.environ:
            r, w = int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"rank must be in 0..world_size-1 and world_size at least 1, got rank={rank}, "
            f"world_size={world_size}."
        )
    return int(rank), int(world_size)


def _record_layout(record_dtype, record_shape, record_bytes):
    if record_dtype is None and record_shape is None and record_bytes is None:
        return None
    if record_bytes is not None:
        if record_dtype is not None or record_shape is not None:
            raise ValueError("pass either record_bytes or record_dtype/record_shape, not both.")
        if record_bytes < 1:
            raise ValueError(f"record_bytes must be positive, got {record_bytes}.")
        return np.dtype(np.uint8), (int(record_bytes),)
    dt = np.dtype(record_dtype if record_dtype is not None else np.uint8)
    shape = tuple(int(x) for x in (record_shape or ()))
    if dt.itemsize * int(np.prod(shape, dtype=np.int64)) < 1:
        raise ValueError("a record must be at least one byte.")
    return dt, shape


class _Prefetcher:
    """Iterator that builds batches on a background thread, ``prefetch`` batches ahead.

    Shards are read whole (parallel O_DIRECT) by a small pool, at most ``prefetch`` shards ahead
    of the batch being built, and dropped after the last batch that uses them. For a GPU the
    batch is gathered into pinned memory and copied on a side stream; the consumer's stream
    waits for that copy.
    """

    _END = object()

    def __init__(self, ds: ShardDataset, batches: list):
        self.ds = ds
        self.batches = batches
        self.q: queue.Queue = queue.Queue(maxsize=ds.prefetch)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="millrace-prefetch", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._produce()
            self._put(self._END)
        except BaseException as e:
            self._put(e)

    def _put(self, item) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _produce(self) -> None:
        ds = self.ds
        starts = ds._starts
        shard_of = [np.searchsorted(starts, b, side="right") - 1 for b in self.batches]
        last_use: dict = {}
        first_order: list = []
        for bi, so in enumerate(shard_of):
            for s in np.unique(so):
                s = int(s)
                if s not in last_use:
                    first_order.append(s)
                last_use[s] = bi
        loaded: dict[int, Future] = {}
        nxt = 0
        torch = _gpu.torch_module()
        stream = None
        if ds.device is not None:
            stream = torch.cuda.Stream(ds.device)
        with ThreadPoolExecutor(2, thread_name_prefix="millrace-shard") as pool:
            for bi, b in enumerate(self.batches):
                if self.stop.is_set():
                    return
                so = shard_of[bi]
                need = {int(s) for s in np.unique(so)}
                # Keep up to `prefetch` shards beyond those this batch needs in flight.
                while nxt < len(first_order) and (
                    first_order[nxt] in need
                    or sum(1 for s in loaded if s not in need) < ds.prefetch
                ):
                    s = first_order[nxt]
                    loaded[s] = pool.submit(ds._load_shard, s)
                    nxt += 1
                local = b - starts[so]
                arrays = []
                fields = ds.shards[0].fields
                for fi, x in enumerate(fields):
                    shape = (len(b), *x.sample_shape)
                    if stream is not None:
                        pin = _gpu.Pinned(len(b) * x.sample_bytes)
                        out = pin.np.view(x.np_dtype).reshape(shape)
                    else:
                        out = np.empty(shape, dtype=x.np_dtype)
                    for s in need:
                        sel = so == s
                        out[sel] = loaded[s].result()[fi][local[sel]]
                    if stream is not None:
                        # Copy from the pinned tensor itself (not a from_numpy alias) so that
                        # torch's host allocator keeps the block until the copy has finished.
                        tdt = torch.from_numpy(out[:0]).dtype
                        src = pin.t.view(tdt).reshape(shape)
                        with torch.cuda.stream(stream):
                            dev = torch.empty(shape, dtype=tdt, device=ds.device)
                            dev.copy_(src, non_blocking=True)
                        out = dev
                    if ds.batch_size is None:
                        out = out[0]
                    arrays.append(out)
                ev = None
                if stream is not None:
                    ev = torch.cuda.Event()
                    ev.record(stream)
                for s in need:
                    if last_use[s] == bi:
                        del loaded[s]
                self._put((arrays, ev))

    def __iter__(self):
        return self

    def __next__(self):
        item = self.q.get()
        if item is self._END:
            self.q.put(item)
            raise StopIteration
        if isinstance(item, BaseException):
            self.close()
            raise item
        arrays, ev = item
        if ev is not None:
            torch = _gpu.torch_module()
            torch.cuda.current_stream(self.ds.device).wait_event(ev)
            for a in arrays:
                a.record_stream(torch.cuda.current_stream(self.ds.device))
        return self.ds._package(arrays, batched=self.ds.batch_size is not None)

    def close(self) -> None:
        self.stop.set()

    def __del__(self):
        self.stop.set()
