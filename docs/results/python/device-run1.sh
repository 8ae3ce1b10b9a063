#!/usr/bin/env bash
# Ran on the GPU machine from the repository root. bench-out/wheels (wheels fetched with pip download)
# and bench-out/fio.tar.xz (a Debian fio 3.33 with its libraries) were carried there, not committed.
# One device run: all tests, then the bench with fio (carried, Debian build + its libs). Writes into $OUT.
set -x
export PYTHONPATH=/tmp/pylib:$PWD/python
python3 - <<'PY'
import glob, zipfile, importlib.util
for w in sorted(glob.glob("bench-out/wheels/*.whl")):
    mod = w.split("/")[-1].split("-")[0].lower().replace("python_dateutil", "dateutil").replace("pillow", "PIL")
    if importlib.util.find_spec(mod) is None:
        zipfile.ZipFile(w).extractall("/tmp/pylib")
PY
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH && fio --version
nproc; free -g | head -2
(cd python && timeout 120 python3 -m pytest -q -p no:cacheprovider tests -rfEs > $OUT/pytest.txt 2>&1; tail -8 $OUT/pytest.txt)
D=/tmp/mb; mkdir -p $D
timeout 440 python3 -m millrace_bench $D/file.bin --create 8G --sizes 4K,64K,1M,16M --threads 1,4,16 \
  --mode cpu,cpu-gpu,gds --seconds 1 --cell-repeat 3 --whole --whole-threads 8 --repeat 3 --checkpoint-gb 4 \
  --csv $OUT/gpu.csv --plot $OUT/gpu.png 2>&1 | tee $OUT/bench.txt
