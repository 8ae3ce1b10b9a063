package driver

import (
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// keyLocks are per-volume (and per-name) try-locks: a second call for a key already being
// worked on is answered Aborted at once, and the orchestrator retries it later (as the CSI
// spec asks), instead of two calls racing on one volume or one call queueing behind a slow
// server. Written here because it is a map and a mutex; ceph-csi's idlocker is the model.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]struct{}
}

func newKeyLocks() *keyLocks { return &keyLocks{held: map[string]struct{}{}} }

// lock takes key, or answers Aborted when another call holds it; call the returned func to
// let go.
func (l *keyLocks) lock(key string) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.held[key]; busy {
		return nil, status.Errorf(codes.Aborted, "an operation on %s is already in progress; try again when it has finished", key)
	}
	l.held[key] = struct{}{}
	return func() {
		l.mu.Lock()
		delete(l.held, key)
		l.mu.Unlock()
	}, nil
}
