package driver

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millrace.dev/csi/internal/millrace"
)

// DefaultVolumeBytes is the size of a volume whose request names none.
const DefaultVolumeBytes = 1 << 30

func (d *Driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
		csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
		csi.ControllerServiceCapability_RPC_GET_CAPACITY,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume makes the volume on the server and pool with the most free space that the
// request's topology and parameters allow; a retry with the same name finds the volume it made.
func (d *Driver) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume name is missing")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.GetVolumeContentSource() != nil {
		return nil, status.Error(codes.InvalidArgument, "volumes cannot be made from snapshots or other volumes (yet)")
	}
	pp, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	size, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	if size < 0 || limit < 0 || (limit > 0 && size > limit) {
		return nil, status.Errorf(codes.OutOfRange, "the capacity range %d..%d bytes is empty", size, limit)
	}
	if size == 0 {
		size = DefaultVolumeBytes
		if limit > 0 && limit < size {
			size = limit
		}
	}
	unlock, err := d.locks.lock("name " + req.GetName())
	if err != nil {
		return nil, err
	}
	defer unlock()
	allowed, preferred := allowedZones(req.GetAccessibilityRequirements())

	views := d.survey(ctx, d.servers)
	if srv, p, v := findByName(views, req.GetName()); srv != nil {
		if v.SizeBytes < size || (limit > 0 && v.SizeBytes > limit) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s already exists with %d bytes, outside the %d..%d bytes asked for now", req.GetName(), v.SizeBytes, size, limit)
		}
		if !poolFits(*p, pp) {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s already exists in pool %s on %s, which does not match the parameters asked for now", req.GetName(), p.Name, srv.Name)
		}
		return d.created(srv, p, v), nil
	}
	id, err := d.reservation(req.GetName(), views)
	if err != nil {
		return nil, err
	}
	var c *candidate
	if id != nil {
		c = d.reservedCandidate(views, *id)
	} else {
		c = place(views, pp, size, limit, allowed, preferred)
	}
	if c == nil {
		return nil, d.noRoom(views, pp, size, allowed)
	}
	vid := VolumeID{Server: c.srv.Name, Pool: c.pool.Name, Volume: VolumeName(req.GetName())}
	d.reserve(req.GetName(), vid)
	v, err := c.srv.CreateVolume(ctx, vid.Pool, vid.Volume, size, map[string]string{TagName: req.GetName()})
	if millrace.IsStatus(err, http.StatusConflict) {
		// Made meanwhile (by an earlier call whose answer was lost): read it back.
		v, err = c.srv.Volume(ctx, vid.Pool, vid.Volume)
		if err == nil && v.Props[TagName] != req.GetName() {
			return nil, status.Errorf(codes.AlreadyExists, "pool %s on %s already holds a volume named %s that this driver did not make for %s; delete it or rename the claim", vid.Pool, vid.Server, vid.Volume, req.GetName())
		}
	}
	if err != nil {
		return nil, apiStatus(err, fmt.Sprintf("creating volume %s in pool %s on %s", req.GetName(), vid.Pool, vid.Server))
	}
	return d.created(c.srv, &c.pool, v), nil
}

// reservation is where an earlier call placed this name, if any. A reservation on a server
// that does not answer now is Unavailable: placing the volume elsewhere could make two.
func (d *Driver) reservation(name string, views []serverView) (*VolumeID, error) {
	d.resMu.Lock()
	id, ok := d.reserved[name]
	d.resMu.Unlock()
	if !ok {
		return nil, nil
	}
	for _, v := range views {
		if v.srv.Name == id.Server && v.err != nil {
			return nil, status.Errorf(codes.Unavailable, "volume %s was being created on %s, which does not answer now (%v); the driver waits for it rather than make a second volume elsewhere", name, id.Server, v.err)
		}
	}
	return &id, nil
}

func (d *Driver) reserve(name string, id VolumeID) {
	d.resMu.Lock()
	d.reserved[name] = id
	d.resMu.Unlock()
}

// unreserve forgets the reservation of a volume that is gone.
func (d *Driver) unreserve(id VolumeID) {
	d.resMu.Lock()
	defer d.resMu.Unlock()
	for name, r := range d.reserved {
		if r == id {
			delete(d.reserved, name)
		}
	}
}

func (d *Driver) reservedCandidate(views []serverView, id VolumeID) *candidate {
	for _, v := range views {
		for _, p := range v.pools {
			if v.srv.Name == id.Server && p.Name == id.Pool {
				return &candidate{srv: v.srv, pool: p}
			}
		}
	}
	return nil
}

// noRoom says why no pool took the volume: a server that is down (named) may have had room;
// otherwise no pool matches the parameters, or none has the space.
func (d *Driver) noRoom(views []serverView, pp placementParams, size int64, allowed map[string]bool) error {
	var down []string
	matching := 0
	for _, v := range views {
		if allowed != nil && !allowed[v.srv.zone] {
			continue
		}
		if v.err != nil {
			down = append(down, v.err.Error())
			continue
		}
		for _, p := range v.pools {
			if poolFits(p, pp) {
				matching++
			}
		}
	}
	zones := "any zone"
	if allowed != nil {
		var z []string
		for k := range allowed {
			z = append(z, k)
		}
		sort.Strings(z)
		zones = "zone " + strings.Join(z, ", ")
	}
	if len(down) > 0 {
		return status.Errorf(codes.Unavailable, "no server that answers in %s has room for %d bytes, and some do not answer: %s", zones, size, strings.Join(down, "; "))
	}
	if matching == 0 {
		return status.Errorf(codes.InvalidArgument, "no pool in %s matches the parameters (pool %q, level %q, minRedundancy %d); check the StorageClass", zones, pp.pool, pp.level, pp.redundancy)
	}
	return status.Errorf(codes.ResourceExhausted, "no pool in %s has %d bytes free in one range for this volume; add drives or servers, or delete volumes", zones, size)
}

func (d *Driver) created(srv *server, p *millrace.Pool, v *millrace.Volume) *csi.CreateVolumeResponse {
	id := VolumeID{Server: srv.Name, Pool: p.Name, Volume: v.Name}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      id.String(),
		CapacityBytes: v.SizeBytes,
		VolumeContext: map[string]string{
			CtxServer:     srv.URL.String(),
			CtxPool:       p.Name,
			CtxUUID:       v.UUID,
			CtxStrip:      strconv.FormatInt(p.StripBytes, 10),
			CtxFullStripe: strconv.FormatInt(p.FullStripeBytes, 10),
		},
		AccessibleTopology: []*csi.Topology{{Segments: map[string]string{ZoneKey: srv.zone}}},
	}}
}

// lookup finds the server a volume id names and the volume; NotFound when either is gone.
func (d *Driver) lookup(ctx context.Context, id string) (VolumeID, *server, *millrace.Volume, error) {
	vid, ok := ParseVolumeID(id)
	if !ok {
		return vid, nil, nil, status.Errorf(codes.NotFound, "%q is not a volume id this driver made (they look like mr1/SERVER/POOL/VOLUME)", id)
	}
	srv := d.byName[vid.Server]
	if srv == nil {
		return vid, nil, nil, status.Errorf(codes.NotFound, "volume %s is on server %s, which is not among this driver's --server flags", id, vid.Server)
	}
	v, err := srv.Volume(ctx, vid.Pool, vid.Volume)
	if err != nil {
		return vid, srv, nil, apiStatus(err, "looking up volume "+id)
	}
	return vid, srv, v, nil
}

// DeleteVolume deletes the volume (success when it is gone already); refused while it is
// published to a node.
func (d *Driver) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if vid, ok := ParseVolumeID(req.GetVolumeId()); !ok {
		return &csi.DeleteVolumeResponse{}, nil // never ours, so nothing of ours to delete
	} else if d.byName[vid.Server] == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is on server %s, which is not among this driver's --server flags; add it back to delete the volume", req.GetVolumeId(), vid.Server)
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	vid, srv, v, err := d.lookup(ctx, req.GetVolumeId())
	if status.Code(err) == codes.NotFound && srv != nil {
		d.unreserve(vid)
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	if e := v.Export(); e != nil {
		if len(e.Hosts) > 0 || e.AllowAnyHost {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published to %s; unpublish it first", req.GetVolumeId(), strings.Join(e.Hosts, ", "))
		}
		if err := srv.UnexportNVMe(ctx, vid.Pool, vid.Volume); err != nil && !millrace.IsStatus(err, http.StatusNotFound) {
			return nil, apiStatus(err, "removing the empty export of "+req.GetVolumeId())
		}
	}
	if err := srv.DeleteVolume(ctx, vid.Pool, vid.Volume); err != nil && !millrace.IsStatus(err, http.StatusNotFound) {
		return nil, apiStatus(err, "deleting volume "+req.GetVolumeId())
	}
	d.unreserve(vid)
	return &csi.DeleteVolumeResponse{}, nil
}

func (d *Driver) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume capabilities are missing")
	}
	if _, _, _, err := d.lookup(ctx, req.GetVolumeId()); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}
