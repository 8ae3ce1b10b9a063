import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import safetensors
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import millrace

DTYPES = [
    np.float64,
    np.float32,
    np.float16,
    np.int64,
    np.int32,
    np.int16,
    np.int8,
    np.uint8,
    np.bool_,
]


def _state(rng):
    return {
        "embed.weight": rng.standard_normal((300, 64)).astype(np.float32),
        "layer.0.bias": rng.standard_normal(64).astype(np.float16),
        "step": np.array(1000, dtype=np.int64),
        "empty": np.zeros((0, 7), dtype=np.float32),
        "mask": rng.integers(0, 2, (5, 5)).astype(bool),
        "strided": np.arange(100, dtype=np.int32).reshape(10, 10)[:, ::3],
        "big": rng.standard_normal(3_000_000),
    }


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k])
        for k in a
    )


def test_safetensors_library_reads_our_checkpoint(tmp_path, rng):
    sd = _state(rng)
    p = str(tmp_path / "c.safetensors")
    size = millrace.save_checkpoint(sd, p, metadata={"step": "1000"}, threads=4, chunk=1 << 20)
    assert os.path.getsize(p) == size
    assert _equal(
        safetensors.numpy.load_file(p), {k: np.array(v, order="C") for k, v in sd.items()}
    )
    with safetensors.safe_open(p, "np") as f:
        assert f.metadata() == {"step": "1000"}
    assert os.listdir(tmp_path) == ["c.safetensors"]


def test_tensor_data_starts_aligned(tmp_path, rng):
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint(_state(rng), p)
    with open(p, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
    assert (8 + n) % 4096 == 0


def test_we_read_safetensors_library_files(tmp_path, rng):
    sd = {k: np.array(v, order="C") for k, v in _state(rng).items()}
    p = str(tmp_path / "lib.safetensors")
    safetensors.numpy.save_file(sd, p)
    assert _equal(millrace.load_checkpoint(p, framework="numpy", threads=3, chunk=1 << 16), sd)


_arrays = st.lists(
    st.tuples(
        st.sampled_from(DTYPES),
        st.lists(st.integers(0, 9), min_size=0, max_size=3),
    ),
    min_size=0,
    max_size=6,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=_arrays, seed=st.integers(0, 2**32 - 1))
def test_round_trip_both_ways_any_state_dict(tmp_path_factory, specs, seed):
    rng = np.random.default_rng(seed)
    sd = {}
    for i, (dt, shape) in enumerate(specs):
        a = rng.integers(0, 100, size=shape).astype(dt)
        sd[f"t{i}.{np.dtype(dt).name}"] = a
    d = tmp_path_factory.mktemp("rt")
    ours = str(d / "ours.safetensors")
    millrace.save_checkpoint(sd, ours, threads=2, chunk=4096)
    if sd:
        assert _equal(safetensors.numpy.load_file(ours), sd)
    assert _equal(millrace.load_checkpoint(ours, framework="numpy"), sd)
    if sd:
        theirs = str(d / "theirs.safetensors")
        safetensors.numpy.save_file(sd, theirs)
        assert _equal(millrace.load_checkpoint(theirs, framework="numpy"), sd)


def test_truncated_checkpoint_is_a_clear_error(tmp_path, rng):
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint(_state(rng), p)
    os.truncate(p, os.path.getsize(p) - 1000)
    with pytest.raises(millrace.TruncatedFileError, match="truncated"):
        millrace.load_checkpoint(p, framework="numpy")
    os.truncate(p, 5)
    with pytest.raises(millrace.TruncatedFileError, match="too short"):
        millrace.load_checkpoint(p, framework="numpy")


def test_not_a_checkpoint_is_a_clear_error(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\0" * 8192)
    with pytest.raises(millrace.FormatError, match="interrupted save"):
        millrace.load_checkpoint(str(p), framework="numpy")
    p.write_bytes(struct.pack("<Q", 10) + b"not json!!")
    with pytest.raises(millrace.FormatError, match="corrupt"):
        millrace.load_checkpoint(str(p), framework="numpy")
    with pytest.raises(FileNotFoundError, match="No such file"):
        millrace.load_checkpoint(str(tmp_path / "missing.safetensors"))


def test_bad_state_dicts_are_clear_errors(tmp_path):
    p = str(tmp_path / "c.safetensors")
    with pytest.raises(TypeError, match="torch tensors or NumPy arrays"):
        millrace.save_checkpoint({"a": [1, 2, 3]}, p)
    with pytest.raises(millrace.DTypeMismatchError, match="cannot be stored"):
        millrace.save_checkpoint({"a": np.array(["x"])}, p)
    with pytest.raises(TypeError, match="keys must be str"):
        millrace.save_checkpoint({1: np.zeros(1)}, p)
    assert not os.path.exists(p)


def test_save_replaces_an_old_checkpoint_atomically(tmp_path, rng):
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint({"a": np.zeros(10)}, p)
    millrace.save_checkpoint({"b": np.ones(3)}, p)
    assert _equal(millrace.load_checkpoint(p, framework="numpy"), {"b": np.ones(3)})
    assert os.listdir(tmp_path) == ["c.safetensors"]


_CHILD = r"""
import sys
import numpy as np
import millrace
path = sys.argv[1]
sd = {f"t{i:02d}": np.full(1_000_000, i + 1, dtype=np.float64) for i in range(12)}
print("ready", flush=True)
while True:
    millrace.save_checkpoint(sd, path, threads=4, chunk=1 << 20)
"""


def _loads(path):
    try:
        return safetensors.numpy.load_file(path)
    except Exception:
        return None


def test_sigkill_during_save_never_leaves_a_bad_checkpoint(tmp_path):
    p = str(tmp_path / "step.safetensors")
    old = {"old": np.arange(10.0)}
    new = {f"t{i:02d}": np.full(1_000_000, i + 1, dtype=np.float64) for i in range(12)}
    rng = np.random.default_rng(7)
    outcomes = set()
    for trial in range(6):
        millrace.save_checkpoint(old, p)
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, p], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout.readline().strip() == "ready"
        time.sleep(float(rng.uniform(0.05, 0.6)) if trial else 0.0)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        # The checkpoint path holds the old or the complete new state dict, never anything else.
        got = _loads(p)
        assert got is not None, "a killed save left an unloadable file at the checkpoint path"
        assert _equal(got, old) or _equal(got, new)
        outcomes.add("old" if _equal(got, old) else "new")
        # Leftover temporary files must never load as a checkpoint with other contents.
        for name in os.listdir(tmp_path):
            if name == "step.safetensors":
                continue
            other = _loads(str(tmp_path / name))
            assert other is None or _equal(other, new), f"{name} loads as a wrong checkpoint"
            os.unlink(tmp_path / name)
    assert outcomes, "no trial ran"
