#!/usr/bin/env bash
# Stop 12's second device run: cuFile (compatibility mode) against the cpu-gpu path and fio.
# cuFile needs the disk's udev properties, which the machine's /run/udev lacks; supply them.
set -x
tar xJf bench-out/fio.tar.xz -C /tmp && export PATH=/tmp/fiopkg:$PATH
export PYTHONPATH=$PWD/python
dev=$(mountpoint -d /); mkdir -p /run/udev/data; printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=ext4\n' > /run/udev/data/b$dev
(cd python && timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py -rfEs 2>&1 | tail -4) | tee $OUT/pytest-gds.txt
D=/tmp/mb; mkdir -p $D
timeout 300 python3 -m millrace_bench $D/file.bin --create 4G --seconds 1 --sizes 4K,64K,1M,16M --threads 1,4,16 \
  --mode cpu-gpu,gds --cell-repeat 3 --csv $OUT/gds.csv --plot $OUT/gds.png 2>&1 | tee $OUT/gds.txt
