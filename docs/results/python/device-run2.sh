#!/usr/bin/env bash
# Ran on the GPU machine from the repository root. bench-out/wheels (wheels fetched with pip download)
# and bench-out/fio.tar.xz (a Debian fio 3.33 with its libraries) were carried there, not committed.
set -x
export PYTHONPATH=/tmp/pylib:$PWD/python
python3 - <<'PY'
import glob, zipfile, importlib.util
for w in sorted(glob.glob("bench-out/wheels/*.whl")):
    mod = w.split("/")[-1].split("-")[0].lower().replace("python_dateutil", "dateutil").replace("pillow", "PIL")
    if importlib.util.find_spec(mod) is None:
        zipfile.ZipFile(w).extractall("/tmp/pylib")
PY
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH
(cd python && timeout 100 python3 -m pytest -q -p no:cacheprovider tests -rfEs > $OUT/pytest.txt 2>&1; tail -4 $OUT/pytest.txt)
D=/tmp/mb; mkdir -p $D
timeout 200 python3 -m millrace_bench $D/file.bin --create 4G --sizes 4K,64K,1M,16M --threads 1,4,16 \
  --mode cpu,cpu-gpu --seconds 1 --cell-repeat 3 --csv $OUT/grid.csv --plot $OUT/grid.png 2>&1 | tee $OUT/grid.txt
MILLRACE_NO_CUDART=1 timeout 80 python3 -m millrace_bench $D/file.bin --sizes 4K,64K --threads 1,4,16 \
  --mode cpu-gpu --seconds 1 --cell-repeat 3 --csv $OUT/grid-torchcopy.csv 2>&1 | tee $OUT/grid-torchcopy.txt
# cuFile needs the disk's udev properties, which this machine's /run/udev lacks; supply them
dev=$(mountpoint -d /); mkdir -p /run/udev/data; printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > /run/udev/data/b$dev
(cd python && timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -rfEs 2>&1 | tail -6) | tee $OUT/pytest-gds.txt
timeout 100 python3 -m millrace_bench $D/file.bin --sizes 64K,1M,16M --threads 1,4,16 --mode gds --seconds 1 \
  --csv $OUT/gds.csv 2>&1 | tee $OUT/gds.txt
tail -5 cufile.log python/cufile.log 2>/dev/null
