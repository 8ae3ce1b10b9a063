#!/usr/bin/env bash
# Stop 12's third device run: 4K and 64K cells with process workers (as fio's jobs), and the
# same 4K cells with threads, in one session. bench-out/fio.tar.xz as in device-run3.sh.
set -x
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH
export PYTHONPATH=$PWD/python
(cd python && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_bench.py -rfEs 2>&1 | tail -4) | tee $OUT/pytest.txt
D=/tmp/mb; mkdir -p $D
B="python3 -m millrace_bench $D/file.bin --seconds 1 --cell-repeat 3 --mode cpu,cpu-gpu"
timeout 240 $B --create 4G --sizes 4K,64K --threads 1,4,16 --workers processes \
  --csv $OUT/procs.csv --plot $OUT/procs.png 2>&1 | tee $OUT/procs.txt
timeout 100 $B --sizes 4K --threads 1,4,16 --csv $OUT/threads4k.csv 2>&1 | tee $OUT/threads4k.txt
# run 7 (a second call right after): the 4K cells again, process workers, five alternations
# timeout 150 $B --create 4G --sizes 4K --threads 1,4,16 --workers processes --cell-repeat 5 \
#   --csv $OUT/procs4k.csv 2>&1 | tee $OUT/procs4k.txt
