# Sourced by guest tests (tests/guest/*.sh) that need RDMA: puts a soft-RoCE device (rdma_rxe)
# on one end of a veth pair with a test address from 198.18.0.0/15 (reserved for such tests; it
# exists only inside the guest). rxe cannot bind `lo`, hence the veth pair. One rxe device talks
# to itself, so a server and a client on 198.18.0.1 in the same guest reach each other over
# RDMA.
#   soft_roce_up           -> 0 with RDMA_ADDR and RDMA_DEV set, or 1 with SOFT_ROCE_WHY saying
#                             what is missing (the caller fails, saying so: never a skip)
#   soft_roce_prove        -> rping server and client exchange over rxe (proves the recipe)
RDMA_ADDR=198.18.0.1
RDMA_DEV=rxe0
SOFT_ROCE_WHY=

soft_roce_up() {
  command -v rdma >/dev/null || {
    SOFT_ROCE_WHY="the rdma tool is missing (Debian's iproute2, which scripts/setup.sh installs)"
    return 1
  }
  if ! modprobe -a rdma_rxe ib_uverbs rdma_ucm veth 2>/dev/null; then
    SOFT_ROCE_WHY="this kernel ($(uname -r)) has no rdma_rxe (soft-RoCE), ib_uverbs, rdma_ucm or veth module"
    return 1
  fi
  if ! ip link show mr0 >/dev/null 2>&1; then
    ip link add mr0 type veth peer name mr1 || { SOFT_ROCE_WHY="cannot create a veth pair"; return 1; }
    ip addr add "$RDMA_ADDR/24" dev mr0
    ip link set mr0 up && ip link set mr1 up
  fi
  if [[ ! -e /sys/class/infiniband/$RDMA_DEV ]]; then
    rdma link add "$RDMA_DEV" type rxe netdev mr0 || { SOFT_ROCE_WHY="rdma link add $RDMA_DEV failed"; return 1; }
  fi
  for _ in $(seq 50); do
    grep -q ACTIVE "/sys/class/infiniband/$RDMA_DEV/ports/1/state" 2>/dev/null && return 0
    sleep 0.2
  done
  SOFT_ROCE_WHY="$RDMA_DEV did not become ACTIVE ($(cat /sys/class/infiniband/$RDMA_DEV/ports/1/state 2>&1))"
  return 1
}

soft_roce_prove() {
  command -v rping >/dev/null || { echo "rping is missing (rdmacm-utils)"; return 1; }
  timeout 90 rping -s -a "$RDMA_ADDR" -C 3 > /tmp/rping-s.out 2>&1 &
  local sp=$! try
  # The server may take more than a second to listen on an emulated CPU; a client that comes
  # too early is rejected (RDMA_CM_EVENT_REJECTED), so it tries again while the server waits.
  for try in 1 2 3 4 5 6; do
    sleep "$try"
    if timeout 20 rping -c -a "$RDMA_ADDR" -C 3 -v > /tmp/rping-c.out 2>&1; then
      wait "$sp" || { cat /tmp/rping-s.out; return 1; }
      grep -q "ping data" /tmp/rping-c.out
      return
    fi
    kill -0 "$sp" 2>/dev/null || break
  done
  cat /tmp/rping-c.out /tmp/rping-s.out; kill "$sp" 2>/dev/null; return 1
}
