package driver

import (
	"context"
	"sort"
	"strconv"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ListVolumes lists the volumes this driver made, on every server that answers, in id order;
// the token is the index of the next entry.
func (d *Driver) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	start := 0
	if t := req.GetStartingToken(); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return nil, status.Errorf(codes.Aborted, "the starting token %q is not one ListVolumes gave", t)
		}
		start = n
	}
	if req.GetMaxEntries() < 0 {
		return nil, status.Error(codes.InvalidArgument, "max_entries cannot be negative")
	}
	var all []*csi.ListVolumesResponse_Entry
	for _, v := range d.survey(ctx, d.servers) {
		if v.err != nil {
			d.log.Warn("listing volumes without a server", "error", v.err)
			continue
		}
		for _, p := range v.pools {
			for _, vol := range p.Volumes {
				if vol.Props[TagName] == "" {
					continue // an operator's own volume, not one of ours
				}
				id := VolumeID{Server: v.srv.Name, Pool: p.Name, Volume: vol.Name}
				var nodes []string
				if e := vol.Export(); e != nil {
					nodes = e.Hosts
				}
				all = append(all, &csi.ListVolumesResponse_Entry{
					Volume: &csi.Volume{VolumeId: id.String(), CapacityBytes: vol.SizeBytes,
						AccessibleTopology: []*csi.Topology{{Segments: map[string]string{ZoneKey: v.srv.zone}}}},
					Status: &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: nodes},
				})
			}
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Volume.VolumeId < all[j].Volume.VolumeId })
	if start > len(all) {
		return nil, status.Errorf(codes.Aborted, "the starting token %d lies past the %d volumes there are now", start, len(all))
	}
	end := len(all)
	if m := int(req.GetMaxEntries()); m > 0 && start+m < end {
		end = start + m
	}
	resp := &csi.ListVolumesResponse{Entries: all[start:end]}
	if end < len(all) {
		resp.NextToken = strconv.Itoa(end)
	}
	return resp, nil
}

// GetCapacity is the free space of the pools that match the parameters, on the servers of the
// zone asked for (all zones when none is); servers that do not answer count as none.
func (d *Driver) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	pp, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if c := req.GetVolumeCapabilities(); len(c) > 0 {
		if err := checkCapabilities(c); err != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	zone, byZone := req.GetAccessibleTopology().GetSegments()[ZoneKey]
	var servers []*server
	for _, s := range d.servers {
		if !byZone || s.zone == zone {
			servers = append(servers, s)
		}
	}
	var free, largest int64
	for _, v := range d.survey(ctx, servers) {
		for _, p := range v.pools {
			if v.err == nil && poolFits(p, pp) {
				free += p.FreeBytes
				largest = max(largest, p.LargestFreeBytes)
			}
		}
	}
	return &csi.GetCapacityResponse{AvailableCapacity: free, MaximumVolumeSize: wrapperspb.Int64(largest)}, nil
}
