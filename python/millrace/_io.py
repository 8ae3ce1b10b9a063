"""Host-side I/O: aligned buffers, O_DIRECT with fallback, parallel reads and writes.

All bulk I/O goes through ``os.preadv``/``os.pwrite`` on slices of page-aligned NumPy buffers,
issued from a small thread pool. Those calls release the GIL, so the threads really run in
parallel in the kernel. O_DIRECT needs the buffer address, the file offset and the length to be
multiples of the logical block size; we align everything to 4 KiB, which covers every common
device, and fall back to buffered I/O where the filesystem refuses O_DIRECT (tmpfs, some FUSE
and network filesystems).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

from .errors import MillraceError, TruncatedFileError

ALIGN = 4096
DEFAULT_CHUNK = 4 << 20
DEFAULT_THREADS = 8
PREALLOCATE = True  # posix_fallocate new output files before writing them

_O_DIRECT = getattr(os, "O_DIRECT", 0)


def round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def round_down(n: int, a: int = ALIGN) -> int:
    return n // a * a


HUGE_MIN = 4 << 20


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """A uint8 array of ``nbytes`` whose first byte sits on an ``align`` boundary.

    Large buffers are anonymous mappings with transparent huge pages requested: the kernel
    faults them in 2 MiB at a time during the first (O_DIRECT) read instead of 4 KiB at a time,
    which is a large share of the cost of reading into fresh memory.
    """
    if nbytes >= HUGE_MIN and align <= mmap.PAGESIZE:
        mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with contextlib.suppress(AttributeError, OSError):
            mm.madvise(mmap.MADV_HUGEPAGE)
        return np.frombuffer(mm, dtype=np.uint8)
    raw = np.empty(nbytes + align, dtype=np.uint8)
    shift = (-raw.ctypes.data) % align
    return raw[shift : shift + nbytes]


def default_threads(threads: Optional[int]) -> int:
    if threads is None:
        return DEFAULT_THREADS
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}; pass a positive count.")
    return int(threads)


def check_path(path: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(
            errno.ENOENT,
            f"No such file: {path!r}. Check the path (and that the share or volume is mounted).",
            path,
        )
    if os.path.isdir(path):
        raise IsADirectoryError(
            errno.EISDIR, f"{path!r} is a directory; pass the path of a file.", path
        )
    return path


class InputFile:
    """A file opened for reading, with O_DIRECT where the filesystem allows it.

    ``direct`` is None for "try", True to insist and False to never use it.
    """

    def __init__(self, path: str, direct: Optional[bool] = None):
        self.path = check_path(path)
        self.fd_buffered = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self.size = os.fstat(self.fd_buffered).st_size
        self.fd_direct = -1
        self.why_not_direct = "disabled by the caller" if direct is False else ""
        if direct is not False and _O_DIRECT:
            try:
                self.fd_direct = os.open(self.path, os.O_RDONLY | _O_DIRECT)
            except OSError as e:
                self.why_not_direct = f"the filesystem refused O_DIRECT ({e.strerror})"
                if direct:
                    self.close()
                    raise MillraceError(
                        f"O_DIRECT was required but {self.path!r} cannot be opened with it "
                        f"({e.strerror}); pass direct=None to fall back to buffered reads."
                    ) from e
        elif not _O_DIRECT:
            self.why_not_direct = "this platform has no O_DIRECT"
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        return self.fd_direct >= 0

    def _drop_direct(self, why: str) -> None:
        with self._lock:
            if self.fd_direct >= 0:
                os.close(self.fd_direct)
                self.fd_direct = -1
                self.why_not_direct = why

    def pread_into(self, view: np.ndarray, offset: int) -> int:
        """Read ``len(view)`` bytes at ``offset`` into ``view`` (uint8); returns bytes read.

        Loops over short reads; stops early only at end of file. The direct descriptor is used
        when the address, offset and length are all aligned.
        """
        want = view.shape[0]
        done = 0
        while done < want:
            part = view[done:]
            fd = self.fd_direct
            if not (
                fd >= 0
                and (offset + done) % ALIGN == 0
                and part.ctypes.data % ALIGN == 0
                and part.shape[0] % ALIGN == 0
            ):
                fd = self.fd_buffered
            try:
                n = os.preadv(fd, [part], offset + done)
            except OSError as e:
                if fd == self.fd_direct and e.errno == errno.EINVAL:
                    self._drop_direct(f"O_DIRECT reads fail on this filesystem ({e.strerror})")
                    continue
                raise
            if n == 0:
                break
            done += n
        return done

    def close(self) -> None:
        for fd in (self.fd_buffered, self.fd_direct):
            if fd >= 0:
                os.close(fd)
        self.fd_buffered = self.fd_direct = -1

    def __enter__(self) -> InputFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_parallel(count: int, threads: int, work: Callable[[int, int], None]) -> None:
    """Call ``work(worker_index, item)`` for every item in range(count) on ``threads`` threads.

    Items are handed out dynamically; the first exception stops the others and is re-raised.
    """
    threads = max(1, min(threads, count))
    if threads == 1:
        for i in range(count):
            work(0, i)
        return
    items = itertools.count()
    failed = threading.Event()

    def loop(w: int) -> None:
        while not failed.is_set():
            i = next(items)
            if i >= count:
                return
            try:
                work(w, i)
            except BaseException:
                failed.set()
                raise

    with ThreadPoolExecutor(threads, thread_name_prefix="millrace-io") as ex:
        futures = [ex.submit(loop, w) for w in range(threads)]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e


def read_range_host(
    f: InputFile,
    offset: int,
    length: int,
    threads: Optional[int] = None,
    chunk: int = DEFAULT_CHUNK,
) -> np.ndarray:
    """Read ``length`` bytes at ``offset`` into a new host array, in parallel, zero-copy.

    The aligned span around the range is read into one aligned buffer and a view of the
    requested bytes is returned, so O_DIRECT applies whatever the offset.
    """
    threads = default_threads(threads)
    if offset + length > f.size:
        raise TruncatedFileError(
            f"{f.path!r} has {f.size} bytes but bytes {offset}..{offset + length} were asked "
            "for; the file is truncated or the request is wrong."
        )
    start = round_down(offset)
    end = offset + length
    span = round_up(end - start)
    buf = aligned_empty(span)
    chunk = max(ALIGN, round_down(chunk))
    count = max(1, (span + chunk - 1) // chunk)

    def work(_w: int, i: int) -> None:
        lo = i * chunk
        hi = min(span, lo + chunk)
        got = f.pread_into(buf[lo:hi], start + lo)
        need = min(hi, end - start) - lo
        if got < need:
            raise TruncatedFileError(
                f"{f.path!r} ended at byte {start + lo + got} while reading up to byte {end}; "
                "the file was truncated (or is being rewritten). Re-copy it and retry."
            )

    if length:
        run_parallel(count, threads, work)
    return buf[offset - start : offset - start + length]


class OutputFile:
    """A new file written in parallel with aligned O_DIRECT writes where possible, then fsynced.

    The file is created under ``path`` directly; the atomic rename is the caller's business.
    """

    def __init__(self, path: str, size: int, direct: Optional[bool] = None):
        self.path = os.fspath(path)
        self.size = size
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
        self.fd_buffered = os.open(self.path, flags, 0o644)
        self.fd_direct = -1
        if direct is not False and _O_DIRECT:
            try:
                self.fd_direct = os.open(self.path, os.O_WRONLY | _O_DIRECT)
            except OSError:
                self.fd_direct = -1
        # Reserve the blocks up front (fewer extents, early ENOSPC) where supported.
        try:
            if not PREALLOCATE:
                raise AttributeError
            if size:
                os.posix_fallocate(self.fd_buffered, 0, size)
        except (OSError, AttributeError):
            os.ftruncate(self.fd_buffered, size)
        self._lock = threading.Lock()

    @property
    def direct(self) -> bool:
        return self.fd_direct >= 0

    def pwrite_all(self, view: np.ndarray, offset: int) -> None:
        done = 0
        want = view.shape[0]
        while done < want:
            part = view[done:]
            fd = self.fd_direct
            if not (
                fd >= 0
                and (offset + done) % ALIGN == 0
                and part.ctypes.data % ALIGN == 0
                and part.shape[0] % ALIGN == 0
            ):
                fd = self.fd_buffered
            try:
                n = os.pwrite(fd, part, offset + done)
            except OSError as e:
                if fd == self.fd_direct and e.errno == errno.EINVAL:
                    with self._lock:
                        if self.fd_direct >= 0:
                            os.close(self.fd_direct)
                            self.fd_direct = -1
                    continue
                raise
            if n <= 0:
                raise OSError(errno.EIO, f"write to {self.path!r} made no progress")
            done += n

    def finish(self, fsync: bool = True) -> None:
        # Aligned tail writes may have run past the real end; cut the file to its size.
        os.ftruncate(self.fd_buffered, self.size)
        if fsync:
            os.fsync(self.fd_buffered)

    def close(self) -> None:
        for fd in (self.fd_buffered, self.fd_direct):
            if fd >= 0:
                os.close(fd)
        self.fd_buffered = self.fd_direct = -1


def write_parallel(
    out: OutputFile,
    start: int,
    end: int,
    fill: Callable[[np.ndarray, int, int], None],
    threads: Optional[int] = None,
    chunk: int = DEFAULT_CHUNK,
    make_staging: Optional[Callable[[int], np.ndarray]] = None,
) -> None:
    """Write file bytes [start, end) in aligned chunks.

    ``fill(buf, file_offset, worker)`` puts the bytes of the chunk into ``buf``. ``start`` must be
    aligned. Each worker owns one aligned staging buffer (``make_staging(chunk)`` gives it, so
    GPU sources can stage in pinned memory). The last chunk is padded up to the alignment; the
    padding is cut off by ``OutputFile.finish``.
    """
    threads = default_threads(threads)
    chunk = max(ALIGN, round_down(chunk))
    total = end - start
    if total <= 0:
        return
    count = (total + chunk - 1) // chunk
    threads = max(1, min(threads, count))
    make = make_staging or aligned_empty
    staging = [make(chunk) for _ in range(threads)]

    def work(w: int, i: int) -> None:
        lo = start + i * chunk
        n = min(chunk, end - lo)
        buf = staging[w][: round_up(n)]
        if n < buf.shape[0]:
            buf[n:] = 0
        fill(buf[:n], lo, w)
        out.pwrite_all(buf, lo)

    run_parallel(count, threads, work)


def fsync_dir(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
