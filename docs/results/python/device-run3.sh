#!/usr/bin/env bash
# Stop 12's device run (one H100 machine), from the repository root. bench-out/fio.tar.xz is a
# Debian fio 3.33 with its shared libraries and their loader (a wrapper runs fio through them),
# carried there and not committed; the machine's own python3 has torch, numpy, safetensors,
# pytest and matplotlib.
set -x
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH && fio --version
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r
(cd python && timeout 150 python3 -m pytest -q -p no:cacheprovider tests -rfEs > $OUT/pytest.txt 2>&1; tail -6 $OUT/pytest.txt)
D=/tmp/mb; mkdir -p $D
B="python3 -m millrace_bench $D/file.bin --seconds 1"
timeout 260 $B --create 4G --sizes 4K,64K,1M,16M --threads 1,4,16 --mode cpu,cpu-gpu --cell-repeat 5 \
  --csv $OUT/grid.csv --plot $OUT/grid.png 2>&1 | tee $OUT/grid.txt
timeout 60 $B --sizes 4K,64K --threads 1,4,16 --mode cpu-gpu --coalesce 0 --cell-repeat 3 2>&1 | tee $OUT/grid-coalesce0.txt
timeout 160 $B --mode '' --whole --whole-threads 8 --repeat 3 --checkpoint-gb 4 \
  --csv $OUT/whole.csv 2>&1 | tee $OUT/whole.txt
