"""``millrace-bench gds`` (gdsio's flags and line) and ``millrace-bench parquet``."""

import csv
import os
import re
import shutil

import numpy as np
import pytest

import millrace_bench as bench
from millrace_bench import gdsio

LINE = re.compile(gdsio.LINE_RE)


def _lines(out: str) -> list:
    return [LINE.match(x) for x in out.splitlines() if x.startswith("IoType:")]


def test_the_line_parses_with_gdsio_own_example():
    # NVIDIA's GDS documentation shows gdsio printing this line
    doc = (
        "IoType: WRITE XferType: CPUONLY Threads: 4 DataSetSize: 4156416/4194304(KiB) "
        "IOSize: 1024(KiB) Throughput: 1.049312 GiB/sec, Avg_Latency: 3721.307952 usecs "
        "ops: 4059 total_time 3.777586 secs"
    )
    assert LINE.match(doc)


@pytest.mark.parametrize("io_type", [0, 1, 2, 3])
def test_cpu_only_prints_gdsio_lines_and_verifies(tmp_path, capsys, io_type):
    f = str(tmp_path / "f")
    args = ["gds", "-f", f, "-s", "8M", "-i", "64K,1M", "-w", "3", "-x", "1"]
    assert bench.main([*args, "-I", str(io_type), "-V"]) == 0
    out = capsys.readouterr().out
    lines = _lines(out)
    assert all(lines), out
    write = io_type in (1, 3)
    assert len(lines) == (4 if write else 2)  # a write with -V is read back and verified
    if write:
        assert out.count("Verifying data") == 2
    io = ["READ", "WRITE", "RANDREAD", "RANDWRITE"][io_type]
    assert lines[0]["io"] == io and lines[0]["xfer"] == "CPUONLY"
    for m in lines:
        assert int(m["threads"]) == 3 and float(m["gibps"]) > 0 and int(m["ops"]) > 0
        assert int(m["ops"]) * int(m["iosize"]) == int(m["done"])
    # each thread's share rounded down to whole I/Os: 8M / 3 threads in 64 KiB or 1 MiB I/Os
    assert [int(m["done"]) for m in lines if m["io"] == io] == [2688 * 3, 2048 * 3]


def test_verify_catches_wrong_bytes(tmp_path, capsys):
    f = tmp_path / "f"
    args = ["gds", "-f", str(f), "-s", "1M", "-i", "64K", "-w", "2", "-x", "1", "-I", "0", "-V"]
    assert bench.main(args) == 0
    data = bytearray(f.read_bytes())
    data[700_000] ^= 0xFF  # keep the first 4 KiB (the bench would rewrite a foreign file)
    f.write_bytes(bytes(data))
    assert bench.main(args) == 1
    assert "verification failed" in capsys.readouterr().err


def test_time_based_directory_run_with_csv_and_plot(tmp_path, capsys):
    d = tmp_path / "d"
    out_csv, out_png = tmp_path / "o.csv", tmp_path / "o.png"
    args = ["gds", "-D", str(d), "-s", "2M", "-i", "4K,128K", "-w", "1,2", "-x", "1"]
    args += ["-I", "2", "-T", "0.3", "--csv", str(out_csv), "--plot", str(out_png), "--h2d"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert len(_lines(out)) == 4
    assert sorted(os.listdir(d)) == ["gdsio.0", "gdsio.1"]
    rows = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert {(r["threads"], r["io_size"]) for r in rows} == {
        (t, s) for t in ("1", "2") for s in ("4096", "131072")
    }
    assert all(r["path"] == "cpu" and r["xfer_type"] == "CPUONLY" for r in rows)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed")
@pytest.mark.parametrize("io_type", [0, 1])
def test_fio_on_the_same_file_and_the_ratio(tmp_path, capsys, io_type):
    f = str(tmp_path / "f")
    out_csv = tmp_path / "o.csv"
    args = ["gds", "-f", f, "-s", "8M", "-i", "128K", "-w", "2", "-x", "1", "-I", str(io_type)]
    assert bench.main([*args, "--fio", "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^fio \(same file.*millrace/fio [\d.]+$", out, re.M), out
    (row,) = csv.DictReader(out_csv.read_text().splitlines())
    assert float(row["fio_gibps"]) > 0
    assert abs(float(row["ratio_fio"]) - float(row["gibps"]) / float(row["fio_gibps"])) < 1e-3


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    return "" if torch.cuda.is_available() else "no CUDA device"


@pytest.mark.parametrize("xfer", ["0", "2"])
def test_gpu_transfer_types_say_why_they_cannot_run_without_a_gpu(tmp_path, xfer):
    if not _gpu_reason():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="GPU"):
        bench.main(["gds", "-f", str(tmp_path / "f"), "-s", "1M", "-x", xfer])


@pytest.mark.gpu
@pytest.mark.parametrize("xfer", ["0", "2"])
@pytest.mark.parametrize("io_type", [0, 1, 2, 3])
def test_gpu_transfer_types(tmp_path, capsys, xfer, io_type):
    if xfer == "0":
        probe = tmp_path / "probe"
        probe.write_bytes(b"x" * 8192)
        why = bench.gds_usable(str(probe))
        if why:
            pytest.skip(f"GPUD: {why}")
    f = str(tmp_path / "f")
    args = ["gds", "-f", f, "-s", "8M", "-i", "4K,1M", "-w", "2", "-x", xfer]
    assert bench.main([*args, "-I", str(io_type), "-V", "--h2d"]) == 0
    out = capsys.readouterr().out
    lines = _lines(out)
    assert lines and all(lines), out
    assert lines[0]["xfer"] == {"0": "GPUD", "2": "CPU_GPU"}[xfer]
    if xfer == "0":
        assert re.search(r"^millrace path for GPUD: (gds|cufile-compat) ", out, re.M), out


def test_parquet_without_cudf_says_so(tmp_path, capsys):
    try:
        import cudf  # noqa: F401

        pytest.skip("cuDF is installed here")
    except ImportError:
        pass
    assert bench.main(["parquet", str(tmp_path)]) == 2
    assert "cuDF is not importable" in capsys.readouterr().out


def test_parquet_harness_with_pyarrow_cpu(tmp_path, capsys):
    pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    d = tmp_path / "pq"
    out_csv, out_png = tmp_path / "p.csv", tmp_path / "p.png"
    args = ["parquet", str(d), "--engine", "pyarrow", "--create-rows", "50000", "--repeat", "2"]
    assert bench.main([*args, "--csv", str(out_csv), "--plot", str(out_png)]) == 0
    out = capsys.readouterr().out
    assert "pyarrow-cpu" in out and "not cuDF" in out
    rows = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert len(rows) == 2
    for r in rows:
        assert r["engine"] == "pyarrow-cpu" and int(r["rows"]) == 50000
        assert float(r["gbps"]) > 0 and float(r["rows_per_s"]) > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pattern_is_offset_dependent():
    a = gdsio.pattern(0, 1 << 16)
    assert np.array_equal(gdsio.pattern(12345, 777), a[12345 : 12345 + 777])
    assert not np.array_equal(gdsio.pattern(4096, 4096), gdsio.pattern(0, 4096))
