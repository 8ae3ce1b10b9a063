import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import millrace
from millrace import _io


def _file(tmp_path, data: bytes, name="f.bin"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 1 << 20, (3 << 20) + 17])
def test_read_returns_the_file_bytes(tmp_path, rng, size):
    data = rng.integers(0, 256, size, dtype=np.uint8)
    p = _file(tmp_path, data.tobytes())
    # a small chunk forces many parallel, aligned requests
    out = millrace.read(p, threads=4, chunk=64 << 10)
    assert isinstance(out, np.ndarray) and out.dtype == np.uint8
    assert np.array_equal(out, data)


def test_large_read_is_aligned_and_uses_o_direct_where_possible(tmp_path, rng):
    data = rng.integers(0, 256, 9 << 20, dtype=np.uint8)
    p = _file(tmp_path, data.tobytes())
    with _io.InputFile(p) as f:
        if not f.direct:
            pytest.skip(f"O_DIRECT unavailable here: {f.why_not_direct}")
        out = _io.read_range_host(f, 0, f.size, threads=3, chunk=1 << 20)
        assert out.ctypes.data % _io.ALIGN == 0
        assert f.direct, "O_DIRECT was dropped on a filesystem that accepted it"
        assert np.array_equal(out, data)


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(0, 300_000), length=st.integers(0, 300_000))
def test_read_any_range(tmp_path_factory, offset, length):
    d = tmp_path_factory.mktemp("r")
    data = np.arange(600_001, dtype=np.uint32).view(np.uint8)[:600_001]
    p = d / "f.bin"
    if not p.exists():
        p.write_bytes(data.tobytes())
    out = millrace.read(str(p), offset=offset, length=length, threads=3, chunk=8192)
    assert np.array_equal(out, data[offset : offset + length])


def test_read_past_end_is_a_clear_error(tmp_path):
    p = _file(tmp_path, b"x" * 100)
    with pytest.raises(millrace.TruncatedFileError, match="100 bytes"):
        millrace.read(p, offset=50, length=51)


def test_buffered_fallback_on_tmpfs(rng):
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm")
    data = rng.integers(0, 256, (1 << 20) + 5, dtype=np.uint8)
    p = f"/dev/shm/millrace-test-{os.getpid()}.bin"
    try:
        millrace.write(p, data)
        # older tmpfs refuses O_DIRECT (newer accepts it); either way the bytes must come back
        assert np.array_equal(millrace.read(p, chunk=1 << 16), data)
        assert np.array_equal(millrace.read(p, direct=False, offset=3, length=9), data[3:12])
    finally:
        os.unlink(p)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such file"):
        millrace.read(str(tmp_path / "nope.bin"))


def test_directory_is_a_clear_error(tmp_path):
    with pytest.raises(IsADirectoryError, match="directory"):
        millrace.read(str(tmp_path))


def test_file_truncated_while_reading(tmp_path, rng):
    data = rng.integers(0, 256, 4 << 20, dtype=np.uint8)
    p = _file(tmp_path, data.tobytes())
    with _io.InputFile(p) as f:
        os.truncate(p, 1 << 20)
        with pytest.raises(millrace.TruncatedFileError, match="truncated"):
            _io.read_range_host(f, 0, f.size, threads=2, chunk=1 << 20)


@pytest.mark.parametrize("size", [0, 1, 5000, (2 << 20) + 3])
def test_write_then_read_back(tmp_path, rng, size):
    data = rng.integers(0, 256, size, dtype=np.uint8)
    p = str(tmp_path / "w.bin")
    assert millrace.write(p, data, threads=3, chunk=1 << 16) == size
    assert os.path.getsize(p) == size
    assert np.fromfile(p, dtype=np.uint8).tobytes() == data.tobytes()
    assert os.listdir(tmp_path) == ["w.bin"], "the temporary file was left behind"


def test_write_accepts_bytes_and_non_contiguous_arrays(tmp_path):
    p = str(tmp_path / "w.bin")
    millrace.write(p, b"hello world")
    with open(p, "rb") as fh:
        assert fh.read() == b"hello world"
    a = np.arange(20, dtype=np.int16).reshape(4, 5)[:, ::2]
    millrace.write(p, a)
    assert np.fromfile(p, dtype=np.int16).tolist() == np.ascontiguousarray(a).ravel().tolist()


def test_write_into_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        millrace.write(str(tmp_path / "no" / "such" / "f.bin"), b"x")


def test_write_rejects_unknown_objects(tmp_path):
    with pytest.raises(TypeError, match="NumPy array"):
        millrace.write(str(tmp_path / "f.bin"), object())


def _has_cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    p = _file(tmp_path, b"abc")
    with pytest.raises(millrace.DeviceUnavailableError, match="device='cpu'"):
        millrace.read(p, device="cuda")
    with pytest.raises(millrace.DeviceUnavailableError):
        millrace.load_checkpoint(p, device="cuda")
    with pytest.raises(millrace.DeviceUnavailableError, match="device='cpu'"):
        millrace.ShardDataset(p, device="cuda", record_bytes=1)


def test_bad_device_string(tmp_path):
    p = _file(tmp_path, b"abc")
    with pytest.raises(ValueError, match="'cpu' or 'cuda"):
        millrace.read(p, device="tpu")


def test_import_needs_only_numpy():
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['cupy'] = None\n"
        "import millrace, numpy as np\n"
        "print(millrace.describe())\n"
        "print(millrace.ShardDataset.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "PyTorch not installed" in out.stdout
    assert "ShardDataset" in out.stdout
