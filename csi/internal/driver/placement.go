package driver

import (
	"context"
	"sort"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"millrace.dev/csi/internal/millrace"
)

// serverView is what one server answered when asked for its pools, or why it did not.
type serverView struct {
	srv   *server
	pools []millrace.Pool
	err   error
}

// survey asks the servers for their pools, all at once.
func (d *Driver) survey(ctx context.Context, servers []*server) []serverView {
	out := make([]serverView, len(servers))
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pools, err := s.Pools(ctx)
			out[i] = serverView{srv: s, pools: pools, err: err}
		}()
	}
	wg.Wait()
	return out
}

// candidate is a pool a new volume could go to.
type candidate struct {
	srv  *server
	pool millrace.Pool
}

// allowedZones reads the request's topology: the zones the volume may be placed in (nil: any)
// and the zone preferred first (the zone of the node a pod was scheduled to, with
// WaitForFirstConsumer), or "".
func allowedZones(req *csi.TopologyRequirement) (allowed map[string]bool, preferred string) {
	zonesOf := func(ts []*csi.Topology) []string {
		var z []string
		for _, t := range ts {
			if v, ok := t.GetSegments()[ZoneKey]; ok {
				z = append(z, v)
			}
		}
		return z
	}
	req0 := zonesOf(req.GetRequisite())
	pref := zonesOf(req.GetPreferred())
	if len(req0) == 0 {
		req0 = pref
	}
	if len(req0) > 0 {
		allowed = map[string]bool{}
		for _, z := range req0 {
			allowed[z] = true
		}
	}
	if len(pref) > 0 {
		preferred = pref[0]
	}
	return allowed, preferred
}

// poolFits tells whether a pool satisfies the StorageClass parameters (not its free space).
func poolFits(p millrace.Pool, pp placementParams) bool {
	if strings.HasPrefix(p.State, "offline") {
		return false
	}
	if pp.pool != "" && p.Name != pp.pool {
		return false
	}
	if pp.level != "" && !strings.EqualFold(p.Level, pp.level) {
		return false
	}
	if pp.redundancy >= 0 {
		r, ok := levelRedundancy[strings.ToLower(p.Level)]
		if !ok || r < pp.redundancy {
			return false
		}
	}
	return true
}

// roundUp is size rounded up to whole stripes of the pool (as the server rounds it).
func roundUp(size, stripe int64) int64 {
	if stripe <= 0 {
		return size
	}
	return (size + stripe - 1) / stripe * stripe
}

// place picks where a volume of size bytes goes: among the pools that fit the parameters, hold
// the size (rounded up to their stripe, within limit when one is given) in one free range, and
// lie in an allowed zone, the preferred zone first, then the pool with the most free space.
// It returns nil when no pool can take it.
func place(views []serverView, pp placementParams, size, limit int64, allowed map[string]bool, preferred string) *candidate {
	var all []candidate
	for _, v := range views {
		if v.err != nil || (allowed != nil && !allowed[v.srv.zone]) {
			continue
		}
		for _, p := range v.pools {
			need := roundUp(size, p.FullStripeBytes)
			if !poolFits(p, pp) || p.LargestFreeBytes < need || (limit > 0 && need > limit) {
				continue
			}
			all = append(all, candidate{srv: v.srv, pool: p})
		}
	}
	if len(all) == 0 {
		return nil
	}
	sort.SliceStable(all, func(i, j int) bool {
		pi, pj := all[i].srv.zone == preferred, all[j].srv.zone == preferred
		if pi != pj {
			return pi
		}
		return all[i].pool.FreeBytes > all[j].pool.FreeBytes
	})
	return &all[0]
}

// findByName looks for the volume made for a CSI name on the servers that answered.
func findByName(views []serverView, csiName string) (*server, *millrace.Pool, *millrace.Volume) {
	want := VolumeName(csiName)
	for _, v := range views {
		for pi := range v.pools {
			p := &v.pools[pi]
			for vi := range p.Volumes {
				vol := &p.Volumes[vi]
				if vol.Name == want && vol.Props[TagName] == csiName {
					return v.srv, p, vol
				}
			}
		}
	}
	return nil, nil, nil
}
