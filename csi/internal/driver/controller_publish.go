package driver

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millrace.dev/csi/internal/millrace"
)

// ControllerPublishVolume exports the volume over NVMe/TCP to the node's host NQN only (adding
// the node to the export when it has one), and tells the node where to connect.
func (d *Driver) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	case req.GetNodeId() == "":
		return nil, status.Error(codes.InvalidArgument, "the node id is missing")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "the volume capability is missing")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	node := req.GetNodeId()
	if !isNQN(node) {
		return nil, status.Errorf(codes.NotFound, "node %q is unknown: this driver's node ids are NVMe host NQNs", node)
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	vid, srv, v, err := d.lookup(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	host, ctrl, err := dhchapSecrets(req.GetSecrets())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "controller publish secret: "+err.Error())
	}
	var keys *millrace.DHChap
	if host != "" {
		keys = &millrace.DHChap{Secret: host, CtrlSecret: ctrl}
	}
	export, err := d.exportTo(ctx, srv, vid, v, node, keys)
	if err != nil {
		return nil, err
	}
	target, err := d.target(ctx, srv)
	if err != nil {
		return nil, err
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		PubTransport: target.Transport,
		PubAddress:   target.Address,
		PubPort:      strconv.Itoa(target.Port),
		PubNQN:       export.NQN,
		CtxUUID:      v.UUID,
	}}, nil
}

// exportTo makes sure the node, and no other, may connect to the volume; with keys, only after
// authenticating with them. The server has the secrets before it lets the node in, so there is
// no moment at which the node could connect without them.
func (d *Driver) exportTo(ctx context.Context, srv *server, vid VolumeID, v *millrace.Volume, node string, keys *millrace.DHChap) (*millrace.NVMeExport, error) {
	e := v.Export()
	if e == nil {
		e, err := srv.ExportNVMe(ctx, vid.Pool, vid.Volume, vid.SubsystemNQN(), []string{node}, keys)
		return e, apiStatus(err, "exporting "+vid.String()+" to "+node)
	}
	if (len(e.Hosts) > 0 || e.AllowAnyHost) && !slices.Contains(e.Hosts, node) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to %s; a volume is attached to one node at a time", vid, strings.Join(e.Hosts, ", "))
	}
	// A publish repeated with secrets sets them again: the Secret may have been rotated.
	if keys != nil {
		if err := srv.SetNVMeHostKeys(ctx, vid.Pool, vid.Volume, node, *keys); err != nil {
			return nil, apiStatus(err, "setting the DH-HMAC-CHAP secrets of "+node+" on the export of "+vid.String())
		}
	}
	if slices.Contains(e.Hosts, node) {
		return e, nil
	}
	e, err := srv.AddNVMeHost(ctx, vid.Pool, vid.Volume, node)
	return e, apiStatus(err, "adding "+node+" to the export of "+vid.String())
}

// target is where nodes connect to the server over NVMe/TCP. A listener on every address
// (0.0.0.0) is reached at the host of the server's API URL.
func (d *Driver) target(ctx context.Context, srv *server) (millrace.Listener, error) {
	st, err := srv.Status(ctx)
	if err != nil {
		return millrace.Listener{}, apiStatus(err, "asking "+srv.Name+" where it serves NVMe/TCP")
	}
	for _, l := range st.NVMeListeners {
		if l.Transport != "tcp" {
			continue
		}
		if l.Unspecified() {
			l.Address = srv.URL.Hostname()
		}
		return l, nil
	}
	return millrace.Listener{}, status.Errorf(codes.FailedPrecondition, "millrace server %s serves no NVMe/TCP (started with --no-nvme?); volumes on it cannot be attached", srv.Name)
}

// ControllerUnpublishVolume takes the node off the volume's export (and disconnects it); the
// export goes when no node is left on it.
func (d *Driver) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the node id is missing")
	}
	done := &csi.ControllerUnpublishVolumeResponse{}
	if _, ok := ParseVolumeID(req.GetVolumeId()); !ok {
		return done, nil
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	vid, srv, v, err := d.lookup(ctx, req.GetVolumeId())
	if status.Code(err) == codes.NotFound {
		return done, nil
	}
	if err != nil {
		return nil, err
	}
	e := v.Export()
	if e == nil {
		return done, nil
	}
	if slices.Contains(e.Hosts, req.GetNodeId()) {
		e, err = srv.RemoveNVMeHost(ctx, vid.Pool, vid.Volume, req.GetNodeId())
		if millrace.IsStatus(err, http.StatusNotFound) {
			return done, nil
		}
		if err != nil {
			return nil, apiStatus(err, "taking "+req.GetNodeId()+" off the export of "+vid.String())
		}
	}
	if len(e.Hosts) == 0 && !e.AllowAnyHost {
		if err := srv.UnexportNVMe(ctx, vid.Pool, vid.Volume); err != nil && !millrace.IsStatus(err, http.StatusNotFound) {
			return nil, apiStatus(err, "removing the export of "+vid.String())
		}
	}
	return done, nil
}

// ControllerExpandVolume grows the volume in place (to whole stripes); the node grows the
// filesystem after.
func (d *Driver) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "the capacity range is missing")
	}
	size, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	vid, srv, v, err := d.lookup(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	nodeToo := req.GetVolumeCapability().GetBlock() == nil
	if v.SizeBytes >= size {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.SizeBytes, NodeExpansionRequired: nodeToo}, nil
	}
	p, err := srv.Pool(ctx, vid.Pool)
	if err != nil {
		return nil, apiStatus(err, "reading pool "+vid.Pool+" on "+srv.Name)
	}
	if need := roundUp(size, p.FullStripeBytes); limit > 0 && need > limit {
		return nil, status.Errorf(codes.OutOfRange, "%d bytes rounded up to whole stripes of %d bytes is %d, above the limit of %d", size, p.FullStripeBytes, need, limit)
	}
	v, err = srv.GrowVolume(ctx, vid.Pool, vid.Volume, size)
	if millrace.IsStatus(err, http.StatusBadRequest) {
		return nil, status.Errorf(codes.OutOfRange, "volume %s cannot grow to %d bytes: %v", vid, size, err)
	}
	if err != nil {
		return nil, apiStatus(err, "growing volume "+vid.String())
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.SizeBytes, NodeExpansionRequired: nodeToo}, nil
}
