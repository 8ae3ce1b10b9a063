# Shared by guest tests that connect the kernel's NVMe host to a subsystem: find_ns waits (up to
# 20 s) for the controller whose subsystem NQN is $NQN and its namespace, and sets ctrl (nvmeN)
# and ns (/dev/nvmeNn1).
find_ns() {
  for _ in $(seq 100); do
    for c in /sys/class/nvme/nvme*; do
      [[ -e $c/subsysnqn && $(cat "$c/subsysnqn") == "$NQN" ]] || continue
      ctrl=$(basename "$c")
      d=$(ls -d /sys/block/nvme*n1 2>/dev/null | grep -v 'c[0-9]*n1$' | head -1)
      [[ -n $d && -b /dev/$(basename "$d") ]] && { ns=/dev/$(basename "$d"); return 0; }
    done
    sleep 0.2
  done
  return 1
}
