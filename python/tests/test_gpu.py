"""GPU paths. Marked ``gpu``: skipped (with the reason) where there is no CUDA device."""

import os

import numpy as np
import pytest

import millrace

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch():
    import torch

    return torch


@pytest.mark.parametrize("size", [1, 4097, (5 << 20) + 3])
@pytest.mark.parametrize("via", ["cpu", "kvikio-posix", "cufile", "auto"])
def test_read_to_gpu(tmp_path, torch, size, via):
    from millrace import _kvikio

    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    p = tmp_path / "f.bin"
    p.write_bytes(data.tobytes())
    try:
        route = _kvikio.plan(via, True)
    except millrace.DeviceUnavailableError as e:
        pytest.skip(f"path {via}: {e}")
    if route in ("gds", "cufile-compat") and bench_gds_why(p):
        pytest.skip(f"cuFile cannot read files here: {bench_gds_why(p)}")
    out = millrace.read(str(p), device="cuda", threads=4, chunk=1 << 20, via=via)
    assert millrace.last_transfer()["path"] == route
    assert out.is_cuda and out.dtype == torch.uint8
    assert np.array_equal(out.cpu().numpy(), data)
    part = millrace.read(str(p), device="cuda", offset=size // 3, length=size // 2, via=via)
    assert np.array_equal(part.cpu().numpy(), data[size // 3 : size // 3 + size // 2])


def bench_gds_why(p) -> str:
    import millrace_bench as bench

    return bench.gds_usable(str(p))


def test_write_from_gpu(tmp_path, torch):
    t = torch.arange(3_000_001, device="cuda", dtype=torch.int32)
    p = str(tmp_path / "w.bin")
    millrace.write(p, t, chunk=1 << 20)
    assert np.array_equal(np.fromfile(p, dtype=np.int32), np.arange(3_000_001, dtype=np.int32))


def test_checkpoint_from_and_to_gpu(tmp_path, torch):
    import safetensors.torch

    g = torch.Generator(device="cuda").manual_seed(0)
    sd = {
        "w": torch.randn(1000, 513, device="cuda", generator=g),
        "w_bf16": torch.randn(777, device="cuda", generator=g).to(torch.bfloat16),
        "b": torch.randn(4, 4, device="cuda", generator=g).t(),  # not contiguous
        "cpu_side": torch.arange(10, dtype=torch.int64),
        "scalar": torch.tensor(3.5, device="cuda"),
    }
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint(sd, p, chunk=1 << 20)
    ref = safetensors.torch.load_file(p)
    for k, v in sd.items():
        assert torch.equal(ref[k], v.cpu()), k
    back = millrace.load_checkpoint(p, device="cuda", chunk=1 << 20)
    for k, v in sd.items():
        assert back[k].is_cuda and back[k].dtype == v.dtype and torch.equal(back[k], v.cuda()), k


def test_dataset_on_gpu_matches_cpu(tmp_path, torch):
    for s in range(3):
        millrace.save_checkpoint(
            {
                "x": np.arange(40 * 3, dtype=np.float32).reshape(40, 3) + s * 1000,
                "y": np.arange(40, dtype=np.int64) + s * 1000,
            },
            str(tmp_path / f"s{s}.safetensors"),
        )
    pattern = str(tmp_path / "*.safetensors")
    cpu = list(millrace.ShardDataset(pattern, batch_size=16, shuffle=True, seed=2))
    gpu = list(millrace.ShardDataset(pattern, device="cuda", batch_size=16, shuffle=True, seed=2))
    assert len(cpu) == len(gpu) == 8
    for a, b in zip(cpu, gpu):
        assert b["x"].is_cuda
        assert np.array_equal(a["x"], b["x"].cpu().numpy())
        assert np.array_equal(a["y"], b["y"].cpu().numpy())


def test_a_path_forced_where_it_cannot_work_is_a_clear_error(tmp_path):
    from millrace import _kvikio

    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * 10)
    for via in ("gds", "cufile-compat", "kvikio-posix"):
        try:
            _kvikio.plan(via, True)
        except millrace.DeviceUnavailableError as e:
            with pytest.raises(millrace.DeviceUnavailableError):
                millrace.read(str(p), device="cuda", via=via)
            assert str(e)
    # the automatic choice reads it on whatever path KvikIO (or its absence) allows
    assert millrace.read(str(p), device="cuda").cpu().numpy().tobytes() == b"x" * 10
    assert millrace.last_transfer()["path"] in millrace.PATHS


def test_checkpoint_from_gpu_registers_buffers_once(tmp_path, torch):
    from millrace import _kvikio

    try:
        route = _kvikio.plan("gds", True)
    except millrace.DeviceUnavailableError as e:
        pytest.skip(f"needs GDS: {e}")
    sd = {f"w{i}": torch.randn(1 << 20, device="cuda") for i in range(4)}
    p = str(tmp_path / "c.safetensors")
    millrace.save_checkpoint(sd, p)
    assert millrace.last_transfer()["path"] == route
    n = _kvikio.registered_count()
    millrace.save_checkpoint(sd, p)
    assert _kvikio.registered_count() == n  # registered on the first save only
    back = millrace.load_checkpoint(p, device="cuda")
    for k, v in sd.items():
        assert torch.equal(back[k], v), k


def test_bench_gpu_modes(tmp_path):
    import csv

    import millrace_bench as bench

    f = tmp_path / "d.bin"
    f.write_bytes(os.urandom(8 << 20))
    modes = "cpu,cpu-gpu" + ("" if bench._gds_usable(str(f)) else ",gds")
    out = tmp_path / "o.csv"
    bench.main(
        [
            str(f),
            "--sizes",
            "64K",
            "--threads",
            "2",
            "--mode",
            modes,
            "--seconds",
            "0.3",
            "--fio",
            "no",
            "--csv",
            str(out),
        ]
    )
    rows = [r for r in csv.DictReader(out.read_text().splitlines()) if r["mode"] != "fio"]
    assert {r["mode"] for r in rows} == set(modes.split(","))
    for r in rows:
        if r["mode"] != "cpu":
            # the bytes the cell's last transfers left on the GPU are the file's
            assert r["verified"] == "True", r


@pytest.mark.parametrize("workers", ["threads", "processes"])
@pytest.mark.parametrize("coalesce,per", [("1M", {4096: 256, 65536: 16}), ("0", {4096: 1})])
def test_bench_cpu_gpu_batches_small_transfers(tmp_path, coalesce, per, workers):
    import csv

    import millrace_bench as bench

    f = tmp_path / "d.bin"
    f.write_bytes(os.urandom(16 << 20))
    out = tmp_path / "o.csv"
    sizes = ",".join(str(s) for s in per)
    args = [str(f), "--sizes", sizes, "--threads", "1,3", "--mode", "cpu-gpu", "--seconds", "0.3"]
    args += ["--coalesce", coalesce, "--workers", workers]
    assert bench.main([*args, "--fio", "no", "--csv", str(out)]) == 0
    rows = list(csv.DictReader(out.read_text().splitlines()))
    assert len(rows) == 2 * len(per)
    for r in rows:
        assert int(r["coalesce"]) == per[int(r["size_bytes"])], r
        assert r["verified"] == "True", r
        assert float(r["iops"]) > 0 and 0 < float(r["lat_p50_us"]) <= float(r["lat_p99_us"])
