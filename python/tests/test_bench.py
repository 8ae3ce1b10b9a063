import csv
import multiprocessing
import os
import signal
import threading
import time

import numpy as np
import pytest

import millrace_bench as bench

REQUIRED = ["mode", "size_bytes", "threads", "gbps", "lat_p50_us", "lat_p99_us", "cpu_pct"]


def test_bench_writes_csv_and_png(tmp_path, capsys):
    f = tmp_path / "data.bin"
    f.write_bytes(np.random.default_rng(0).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes())
    out_csv, out_png = tmp_path / "out.csv", tmp_path / "out.png"
    rc = bench.main(
        [
            str(f),
            "--sizes",
            "4K,64K",
            "--threads",
            "1,2",
            "--mode",
            "cpu",
            "--seconds",
            "0.2",
            "--fio",
            "no",
            "--csv",
            str(out_csv),
            "--plot",
            str(out_png),
        ]
    )
    assert rc == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("path: "), first
    rows = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert set(REQUIRED) <= set(rows[0])
    cells = {(r["mode"], int(r["size_bytes"]), int(r["threads"])) for r in rows}
    assert cells == {("cpu", s, t) for s in (4096, 65536) for t in (1, 2)}
    for r in rows:
        assert float(r["gbps"]) > 0
        assert 0 < float(r["lat_p50_us"]) <= float(r["lat_p99_us"])
        assert float(r["cpu_pct"]) >= 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_random_pattern(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(bytes(range(256)) * 4096)
    out_csv = tmp_path / "out.csv"
    args = [str(f), "--sizes", "4K", "--threads", "3", "--mode", "cpu", "--pattern", "rand"]
    assert bench.main([*args, "--seconds", "0.2", "--fio", "no", "--csv", str(out_csv)]) == 0
    (row,) = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert row["mode"] == "cpu" and int(row["threads"]) == 3 and float(row["iops"]) > 0


def test_parse_size():
    assert bench.parse_size("4K") == 4096
    assert bench.parse_size("16M") == 16 << 20
    assert bench.parse_size("1g") == 1 << 30
    assert bench.parse_size("512") == 512


def test_bench_process_workers(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(np.random.default_rng(1).integers(0, 256, 4 << 20, dtype=np.uint8).tobytes())
    out_csv = tmp_path / "out.csv"
    args = [str(f), "--sizes", "4K,64K", "--threads", "3", "--mode", "cpu", "--seconds", "0.3"]
    assert bench.main([*args, "--workers", "processes", "--fio", "no", "--csv", str(out_csv)]) == 0
    rows = list(csv.DictReader(out_csv.read_text().splitlines()))
    assert {(int(r["size_bytes"]), int(r["threads"])) for r in rows} == {(4096, 3), (65536, 3)}
    for r in rows:
        assert r["workers"] == "processes"
        # three processes each read for the cell's 0.3 s: the cell's time is theirs, not a sum
        assert 0.25 < float(r["seconds"]) < 1.0, r
        assert float(r["iops"]) > 0 and 0 < float(r["lat_p50_us"]) <= float(r["lat_p99_us"])
        assert float(r["cpu_pct"]) > 0


def test_a_killed_process_worker_is_reported_not_waited_for(tmp_path):
    f = tmp_path / "data.bin"
    f.write_bytes(bytes(4 << 20))
    errors = []

    def cell():
        try:
            bench.run_cell("cpu", str(f), 4096, 2, 60.0, "seq", workers="processes")
        except Exception as e:
            errors.append(e)

    th = threading.Thread(target=cell, daemon=True)
    t0 = time.monotonic()
    th.start()
    while len(multiprocessing.active_children()) < 2 and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    kids = multiprocessing.active_children()
    if len(kids) < 2:
        pytest.fail("the cell's two worker processes did not start")
    time.sleep(0.5)
    os.kill(kids[0].pid, signal.SIGKILL)
    th.join(30)
    assert not th.is_alive(), "the cell kept waiting for a killed worker"
    assert time.monotonic() - t0 < 30
    assert len(errors) == 1 and "died" in str(errors[0]), errors
