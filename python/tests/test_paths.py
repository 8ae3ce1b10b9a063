"""The data paths: gds, cufile-compat, kvikio-posix (KvikIO) and cpu (millrace's own).

Real transfers run on every path this machine can run; the others are skipped by name with the
reason KvikIO gives (KvikIO 26.10 imports without a GPU, but every transfer, host buffers
included, needs the CUDA driver's libcuda.so.1). The choice of path is tested against a stand-in
for KvikIO's answers, so the logic that turns KvikIO's answers into a path is tested here too.
"""

import os

import numpy as np
import pytest
import safetensors.numpy

import millrace
from millrace import _kvikio

HOST_PATHS = ["cpu", "kvikio-posix"]
DEVICE_PATHS = ["cpu", "kvikio-posix", "cufile-compat", "gds"]


def _cuda_ok():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _unavailable(route: str, device: str) -> str:
    """Why ``route`` cannot run for ``device`` memory here, or empty."""
    if device != "cpu" and not _cuda_ok():
        return "no CUDA device"
    try:
        _kvikio.plan(route, device != "cpu")
    except millrace.DeviceUnavailableError as e:
        return str(e)
    return ""


def _need(route: str, device: str = "cpu") -> None:
    why = _unavailable(route, device)
    if why:
        pytest.skip(f"path {route} ({device} memory) cannot run here: {why}")


# --------------------------------------------------------------------------------------------
# bytes read equal bytes written, on every path that runs here

# unaligned offsets and sizes, and (with a 64 KiB task/chunk) files of many KvikIO tasks
CASES = [(0, 1), (1, 4095), (4095, 4098), (12345, (1 << 20) + 3), (0, (3 << 20) + 17)]


def _roundtrip(tmp_path, route, device, offset, size):
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, offset + size + 777, dtype=np.uint8)
    p = str(tmp_path / "f.bin")
    src = data
    if device != "cpu":
        import torch

        src = torch.from_numpy(data).to(device)
    millrace.write(p, src, chunk=64 << 10, threads=4, via=route)
    assert millrace.last_transfer()["path"] == route
    assert np.array_equal(np.fromfile(p, dtype=np.uint8), data)
    out = millrace.read(p, device, offset=offset, length=size, chunk=64 << 10, via=route)
    assert millrace.last_transfer()["path"] == route
    assert millrace.last_transfer()["bytes"] == size
    got = out if device == "cpu" else out.cpu().numpy()
    assert np.array_equal(got, data[offset : offset + size])


@pytest.mark.parametrize("offset,size", CASES)
@pytest.mark.parametrize("route", HOST_PATHS)
def test_host_memory_bytes_read_equal_bytes_written(tmp_path, route, offset, size):
    _need(route)
    _roundtrip(tmp_path, route, "cpu", offset, size)


@pytest.mark.gpu
@pytest.mark.parametrize("offset,size", CASES)
@pytest.mark.parametrize("route", DEVICE_PATHS)
def test_gpu_memory_bytes_read_equal_bytes_written(tmp_path, route, offset, size):
    _need(route, "cuda")
    _roundtrip(tmp_path, route, "cuda", offset, size)


# --------------------------------------------------------------------------------------------
# a checkpoint written on one path reads back on every other

ENDS = [(r, "cpu") for r in HOST_PATHS] + [(r, "cuda") for r in DEVICE_PATHS]


def _ckpt_state(device):
    rng = np.random.default_rng(7)
    sd = {
        "w": rng.standard_normal((513, 129)).astype(np.float32),
        "b": rng.standard_normal(1001).astype(np.float16),
        "odd": np.arange(3, dtype=np.int8),
        "big": rng.integers(0, 1 << 30, (1 << 20) + 5, dtype=np.int64),
    }
    if device == "cpu":
        return sd
    import torch

    return {k: torch.from_numpy(v).to(device) for k, v in sd.items()}


@pytest.mark.parametrize("writer", ENDS, ids=lambda e: f"{e[0]}@{e[1]}")
@pytest.mark.parametrize("reader", ENDS, ids=lambda e: f"{e[0]}@{e[1]}")
def test_checkpoint_written_on_one_path_reads_back_on_every_other(tmp_path, writer, reader):
    for route, device in (writer, reader):
        _need(route, device)
    sd = _ckpt_state(writer[1])
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint(sd, p, chunk=64 << 10, via=writer[0])
    assert millrace.last_transfer()["path"] == writer[0]
    ref = _ckpt_state("cpu")
    # the safetensors library reads what any path wrote
    lib = safetensors.numpy.load_file(p)
    for k, v in ref.items():
        assert np.array_equal(lib[k], v), k
    framework = "numpy" if reader[1] == "cpu" else "torch"
    back = millrace.load_checkpoint(
        p, reader[1], framework=framework, chunk=64 << 10, via=reader[0]
    )
    assert millrace.last_transfer()["path"] == reader[0]
    for k, v in ref.items():
        got = back[k] if reader[1] == "cpu" else back[k].cpu().numpy()
        assert got.dtype == v.dtype and np.array_equal(got, v), k


# --------------------------------------------------------------------------------------------
# KvikIO itself on this machine


def test_kvikio_answers_on_this_machine():
    """What KvikIO says here is recorded in describe(), and a forced KvikIO path either runs or
    fails with KvikIO's reason, never falling back silently."""
    line = millrace.describe()
    assert "KvikIO" in line
    why = _kvikio.io_ready()
    if why:
        assert why in line
        with pytest.raises(millrace.DeviceUnavailableError, match="kvikio-posix"):
            millrace.read(__file__, via="kvikio-posix")
    else:
        assert "GDS" in line


def test_default_host_path_is_cpu_and_is_reported(tmp_path):
    p = str(tmp_path / "a.bin")
    millrace.write(p, b"hello")
    assert millrace.last_transfer()["path"] == "cpu"
    assert millrace.read(p).tobytes() == b"hello"
    t = millrace.last_transfer()
    assert t["path"] == "cpu" and t["op"] == "read" and t["bytes"] == 5


def test_unknown_path_is_refused(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="via="):
        millrace.read(__file__, via="warp")
    monkeypatch.setenv("MILLRACE_GPU_PATH", "warp")
    with pytest.raises(ValueError, match="MILLRACE_GPU_PATH"):
        millrace.read(__file__)


def test_env_forces_the_path(tmp_path, monkeypatch):
    p = str(tmp_path / "a.bin")
    monkeypatch.setenv("MILLRACE_GPU_PATH", "cpu")
    millrace.write(p, b"x" * 5000)
    assert millrace.last_transfer()["path"] == "cpu"
    monkeypatch.setenv("MILLRACE_GPU_PATH", "gds")
    with pytest.raises(millrace.DeviceUnavailableError):
        millrace.read(p)  # host memory never goes through cuFile (or KvikIO cannot run here)


# --------------------------------------------------------------------------------------------
# the choice of path from KvikIO's answers, and millrace's calls into KvikIO, against a
# stand-in that answers as KvikIO would and moves bytes with os.pread/os.pwrite


class FakeKvikIO:
    """Answers as KvikIO 26.10's Python API does; records what millrace asked of it."""

    __version__ = "fake"

    class CompatMode:
        OFF, ON, AUTO = 0, 1, 2

        def __init__(self, v):
            self.name = {0: "OFF", 1: "ON", 2: "AUTO"}[v]

    def __init__(self, cufile: bool, gds: bool, compat=2):
        fake = self
        self.cufile, self.gds = cufile, gds
        self.settings = {"compat_mode": compat, "num_threads": 1, "task_size": 4 << 20}
        self.opened: list = []  # (filename, flags, compat mode at open)
        self.refuse = False  # cuFileHandleRegister fails (a filesystem cuFile cannot use)
        self.deregistered: list = []
        self.registered: list = []
        self.tasks: list = []

        class Defaults:
            @staticmethod
            def get(k):
                return fake.settings[k]

            @staticmethod
            def set(k, v):
                # as KvikIO's: applied now, undone only when used as a context manager
                return _Setting(fake.settings, k, v)

            @staticmethod
            def is_compat_mode_preferred():
                m = fake.settings["compat_mode"]
                return m == 1 or (m == 2 and not fake.cufile)

        class Driver:
            @staticmethod
            def get(k):
                assert k == "is_gds_available"
                return fake.gds

        self.defaults = Defaults
        self.cufile_driver = Driver

        class CuFile:
            def __init__(self, filename, flags="r"):
                mode = fake.settings["compat_mode"]
                fake.opened.append((filename, flags, mode))
                if mode == 0 and (fake.refuse or not fake.cufile):
                    raise RuntimeError("cuFile not available (compat mode OFF)")
                f = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if "w" in flags else 0)
                self.fd = os.open(filename, f if flags != "r" else os.O_RDONLY, 0o644)

            def fileno(self):
                return self.fd

            def close(self):
                os.close(self.fd)

            def __enter__(self):
                return self

            def __exit__(self, *a):
                self.close()

            def pread(self, buf, size, file_offset=0, task_size=None):
                fake.tasks.append(task_size)
                view = memoryview(np.asarray(buf)).cast("B")[:size]
                n = os.preadv(self.fd, [view], file_offset)
                return _Done(n)

            def pwrite(self, buf, size, file_offset=0, task_size=None):
                fake.tasks.append(task_size)
                data = np.asarray(buf).reshape(-1).view(np.uint8)[:size]
                return _Done(os.pwrite(self.fd, data.tobytes(), file_offset))

        self.CuFile = CuFile

    def memory_register(self, buf):
        self.registered.append(buf.__cuda_array_interface__["data"][0])

    def memory_deregister(self, buf):
        self.deregistered.append(buf.__cuda_array_interface__["data"][0])


class _Setting:
    def __init__(self, settings, k, v):
        self.settings, self.k, self.old = settings, k, settings[k]
        settings[k] = v

    def __enter__(self):
        return None

    def __exit__(self, *a):
        self.settings[self.k] = self.old


class _Done:
    def __init__(self, n):
        self.n = n

    def get(self):
        return self.n


@pytest.fixture
def fake_kvikio(monkeypatch):
    def make(cufile=True, gds=True, compat=2):
        fake = FakeKvikIO(cufile, gds, compat)
        monkeypatch.setattr(_kvikio, "_kv", fake)
        monkeypatch.setattr(_kvikio, "_kv_tried", True)
        monkeypatch.setattr(_kvikio, "_io_why", "")
        monkeypatch.delenv("MILLRACE_GPU_PATH", raising=False)
        return fake

    return make


@pytest.mark.parametrize(
    "cufile,gds,compat,expect",
    [
        (True, True, 2, "gds"),
        (True, False, 2, "cufile-compat"),
        (False, False, 2, "kvikio-posix"),  # AUTO without a usable cuFile
        (True, True, 1, "kvikio-posix"),  # KVIKIO_COMPAT_MODE=ON
        (True, False, 0, "cufile-compat"),  # KVIKIO_COMPAT_MODE=OFF, no GDS
    ],
)
def test_gpu_memory_path_comes_from_kvikio_answers(fake_kvikio, cufile, gds, compat, expect):
    fake_kvikio(cufile, gds, compat)
    assert _kvikio.plan(None, True) == expect
    assert _kvikio.plan("auto", False) == "cpu"  # host memory: millrace's own threads
    assert _kvikio.plan("kvikio-posix", False) == "kvikio-posix"


def test_forcing_a_path_kvikio_says_cannot_run_is_an_error(fake_kvikio, monkeypatch):
    fake_kvikio(cufile=True, gds=False)
    with pytest.raises(millrace.DeviceUnavailableError, match="GDS is not available"):
        _kvikio.plan("gds", True)
    assert _kvikio.plan("cufile", True) == "cufile-compat"
    fake_kvikio(cufile=True, gds=True)
    with pytest.raises(millrace.DeviceUnavailableError, match=r"GDS is\s+available"):
        _kvikio.plan("cufile-compat", True)
    monkeypatch.setenv("MILLRACE_GPU_PATH", "cufile-compat")
    with pytest.raises(millrace.DeviceUnavailableError):
        _kvikio.plan(None, True)
    assert _kvikio.plan("kvikio-posix", True) == "kvikio-posix"
    fake_kvikio(cufile=False, gds=False)
    with pytest.raises(millrace.DeviceUnavailableError, match="no usable cuFile"):
        _kvikio.plan("cufile", True)
    with pytest.raises(millrace.DeviceUnavailableError, match="host buffer"):
        _kvikio.plan("gds", False)
    monkeypatch.setattr(_kvikio, "_io_why", "libcuda.so.1 missing")
    with pytest.raises(millrace.DeviceUnavailableError, match=r"libcuda\.so\.1 missing"):
        _kvikio.plan("kvikio-posix", False)
    assert _kvikio.plan(None, True) == "cpu"  # auto: KvikIO cannot run, millrace's own path


def test_handles_open_with_the_compat_mode_of_their_path(fake_kvikio, tmp_path):
    fake = fake_kvikio(cufile=True, gds=False)
    p = str(tmp_path / "f")
    for route, mode in (("kvikio-posix", 1), ("cufile-compat", 0), ("gds", 0)):
        with _kvikio.opened(p, "w", route):
            pass
        assert fake.opened[-1][2] == mode
        assert fake.settings["compat_mode"] == 2  # restored after the open


@pytest.mark.parametrize("offset,size", CASES)
def test_millrace_calls_into_kvikio_move_the_right_bytes(fake_kvikio, tmp_path, offset, size):
    """write/read/save/load through the KvikIO glue (one handle per call, header after the
    data, fsync, rename), with the stand-in's host-memory I/O."""
    fake = fake_kvikio()
    rng = np.random.default_rng(size)
    data = rng.integers(0, 256, offset + size, dtype=np.uint8)
    p = str(tmp_path / "f.bin")
    millrace.write(p, data, via="kvikio-posix", chunk=64 << 10)
    assert [o[1] for o in fake.opened] == ["w"]
    assert os.listdir(tmp_path) == ["f.bin"]  # the temporary file was renamed
    out = millrace.read(p, offset=offset, length=size, via="kvikio-posix", chunk=64 << 10)
    assert np.array_equal(out, data[offset:])
    assert fake.tasks[-1] == 64 << 10 and fake.settings["task_size"] == 64 << 10
    with pytest.raises(millrace.TruncatedFileError):
        millrace.read(p, offset=offset + 1, length=size, via="kvikio-posix")
    sd = _ckpt_state("cpu")
    c = str(tmp_path / "c.safetensors")
    n_open = len(fake.opened)
    millrace.save_checkpoint(sd, c, via="kvikio-posix")
    assert len(fake.opened) == n_open + 1  # one handle for the whole file, not one per tensor
    lib = safetensors.numpy.load_file(c)
    back = millrace.load_checkpoint(c, framework="numpy", via="kvikio-posix")
    assert len(fake.opened) == n_open + 2
    for k, v in sd.items():
        assert np.array_equal(lib[k], v) and np.array_equal(back[k], v), k
    t = millrace.last_transfer()
    assert t["op"] == "load" and t["path"] == "kvikio-posix"


def test_a_failed_kvikio_write_leaves_no_file(fake_kvikio, tmp_path, monkeypatch):
    fake = fake_kvikio()
    p = tmp_path / "f.bin"
    p.write_bytes(b"old")

    def broken(self, buf, size, file_offset=0, task_size=None):
        return _Done(size - 1)

    monkeypatch.setattr(fake.CuFile, "pwrite", broken)
    with pytest.raises(OSError, match="wrote"):
        millrace.write(str(p), np.zeros(10, np.uint8), via="kvikio-posix")
    assert p.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]


def test_chosen_cufile_path_falls_back_to_posix_where_cufile_refuses_the_file(
    fake_kvikio, tmp_path
):
    fake = fake_kvikio(cufile=True, gds=True)
    fake.refuse = True
    p = tmp_path / "f"
    p.write_bytes(bytes(range(256)) * 40)
    dest = np.zeros(5000, np.uint8)
    # forced: the error is KvikIO's, nothing else is tried
    with pytest.raises(RuntimeError, match="cuFile"):
        _kvikio.pread(str(p), dest, 100, 5000, "gds", 4096, fallback=False)
    # chosen: KvikIO's POSIX path, and that is what is reported
    assert _kvikio.pread(str(p), dest, 100, 5000, "gds", 4096, fallback=True) == "kvikio-posix"
    assert dest.tobytes() == p.read_bytes()[100:5100]
    assert [o[2] for o in fake.opened] == [0, 0, 1]


class _Storage:
    def __init__(self, ptr, n):
        self.ptr, self.n = ptr, n

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.n


class _Tensor:
    """A new object each time over the same storage, as model.state_dict() gives."""

    def __init__(self, storage):
        self.storage = storage

    def untyped_storage(self):
        return self.storage


def test_buffers_are_registered_once_per_storage_and_deregistered_when_freed(fake_kvikio):
    import gc

    fake = fake_kvikio()
    st = _Storage(0x7F0000001000, 1 << 20)
    for _ in range(3):
        assert _kvikio.register_once(_Tensor(st))
    assert fake.registered == [st.ptr] and fake.deregistered == []
    del st
    gc.collect()
    assert fake.deregistered == [0x7F0000001000]
    assert _kvikio.registered_count() == 0
