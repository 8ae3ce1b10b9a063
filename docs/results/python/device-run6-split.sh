#!/usr/bin/env bash
# Stop 25's device run, after the bench moved out of the package into millrace_bench (#20): the
# Python client's whole test suite on a real GPU, then a short grid, whole-file and checkpoint run
# of `python -m millrace_bench` so the split modules are exercised end to end. bench-out/fio.tar.xz
# (Debian fio 3.33 with its libraries and loader) is carried there, not committed.
set -x
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH && fio --version
export PYTHONPATH=$PWD/python
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uname -r
python3 -c 'import torch, numpy, safetensors; print(torch.__version__, torch.cuda.is_available())'
(cd python && timeout 150 python3 -m pytest -q -p no:cacheprovider tests -rfEs > $OUT/pytest.txt 2>&1; tail -8 $OUT/pytest.txt)
D=/tmp/mb; mkdir -p $D
B="python3 -m millrace_bench $D/file.bin --seconds 1"
timeout 150 $B --create 4G --sizes 4K,1M,16M --threads 1,16 --mode cpu,cpu-gpu --cell-repeat 3 \
  --csv $OUT/grid.csv --plot $OUT/grid.png 2>&1 | tee $OUT/grid.txt
timeout 120 $B --mode '' --whole --whole-threads 8 --repeat 2 --checkpoint-gb 2 \
  --csv $OUT/whole.csv 2>&1 | tee $OUT/whole.txt
