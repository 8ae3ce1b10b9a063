package driver

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mountutils "k8s.io/mount-utils"

	"millrace.dev/csi/internal/blockfs"
	"millrace.dev/csi/internal/nvme"
)

// nodeOps is what the node service needs of the machine it runs on.
type nodeOps struct {
	hostNQN string
	opts    nvme.Options
	attach  time.Duration
	mounter mountutils.Interface
	log     *slog.Logger
}

func newNodeOps(hostNQN string, attach time.Duration, log *slog.Logger) *nodeOps {
	return &nodeOps{
		hostNQN: hostNQN,
		opts: nvme.Options{HostNQN: hostNQN, HostID: nvme.HostID(hostNQN, "/etc/nvme"),
			CtrlLossTmo: 600, ReconnectDelay: 2},
		attach:  attach,
		mounter: mountutils.New(""),
		log:     log,
	}
}

// NodeStageVolume connects to the volume with the kernel initiator, waits for its namespace by
// UUID and, for a filesystem volume, mounts it at the staging path, making the filesystem
// first only when the device is blank.
func (d *Driver) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "the staging path is missing")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "the volume capability is missing")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	pc := req.GetPublishContext()
	t := nvme.Target{Transport: pc[PubTransport], Address: pc[PubAddress], Port: pc[PubPort], NQN: pc[PubNQN]}
	uuid := pc[CtxUUID]
	if t.Transport == "" || t.Address == "" || t.Port == "" || t.NQN == "" || uuid == "" {
		return nil, status.Error(codes.InvalidArgument, "the publish context does not say where the volume is served (ControllerPublishVolume sets it)")
	}
	if _, ok := ParseVolumeID(req.GetVolumeId()); !ok {
		return nil, status.Errorf(codes.NotFound, "%q is not a volume id this driver made", req.GetVolumeId())
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	n := d.node
	staging := req.GetStagingTargetPath()
	mount := req.GetVolumeCapability().GetMount()
	if mount != nil {
		if mounted, _ := isMounted(n.mounter, staging); mounted {
			return &csi.NodeStageVolumeResponse{}, nil
		}
	}
	secret, ctrl, err := dhchapSecrets(req.GetSecrets())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "node stage secret: "+err.Error())
	}
	if err := nvme.Connect(ctx, t, n.opts, nvme.Auth{Secret: secret, CtrlSecret: ctrl}); err != nil {
		return nil, status.Errorf(codes.Internal, "connecting to %s at %s:%s: %v", t.NQN, t.Address, t.Port, err)
	}
	dev, err := nvme.WaitNamespace(ctx, uuid, n.attach)
	if err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "connected to %s, but %v", t.NQN, err)
	}
	if mount == nil {
		return &csi.NodeStageVolumeResponse{}, nil // raw block: published straight from the device
	}
	fsType := mount.GetFsType()
	if fsType == "" {
		fsType = defaultFS
	}
	if err := n.ensureFilesystem(ctx, dev, fsType, uuid, req.GetVolumeContext()); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "making the staging path: %v", err)
	}
	opts := mount.GetMountFlags()
	if readOnlyMode(req.GetVolumeCapability()) {
		opts = append(opts, "ro")
	}
	if err := n.mounter.Mount(dev, staging, fsType, opts); err != nil {
		return nil, status.Errorf(codes.Internal, "mounting %s (%s) at %s: %v", dev, fsType, staging, err)
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// ensureFilesystem leaves a filesystem of this volume (its UUID is the volume's) as it is,
// makes one on a blank device, and refuses anything else: a device that holds data which is
// not this volume's filesystem is never overwritten, and never mounted.
func (n *nodeOps) ensureFilesystem(ctx context.Context, dev, fsType, uuid string, vctx map[string]string) error {
	found, err := blockfs.Probe(ctx, dev)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if found.Type != "" {
		if !blockfs.SameUUID(found.UUID, uuid) {
			return status.Errorf(codes.FailedPrecondition, "%s holds %s (UUID %q) that this driver did not make for volume %s; it is neither blank nor this volume's, so it is neither mounted nor overwritten (old data of another volume? the server should hand out new volumes blank)", dev, found.Type, found.UUID, uuid)
		}
		if found.Type != fsType {
			return status.Errorf(codes.FailedPrecondition, "volume %s holds an %s filesystem, not %s as asked", uuid, found.Type, fsType)
		}
		return nil
	}
	blank, err := blockfs.IsZero(dev)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if !blank {
		return status.Errorf(codes.FailedPrecondition, "%s (volume %s) holds data but no filesystem blkid knows; it is not blank, so no filesystem is made over it", dev, uuid)
	}
	g := blockfs.Geometry{}
	g.StripBytes, _ = strconv.ParseInt(vctx[CtxStrip], 10, 64)
	g.FullStripeBytes, _ = strconv.ParseInt(vctx[CtxFullStripe], 10, 64)
	n.log.Info("making a filesystem on a blank volume", "device", dev, "fs", fsType, "uuid", uuid, "strip", g.StripBytes, "stripe", g.FullStripeBytes)
	if err := blockfs.Mkfs(ctx, dev, fsType, uuid, g); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

func isMounted(m mountutils.Interface, path string) (bool, error) {
	notMnt, err := m.IsLikelyNotMountPoint(path)
	if err != nil {
		return false, err
	}
	return !notMnt, nil
}

// NodeUnstageVolume unmounts the staging path and disconnects the volume's subsystem.
func (d *Driver) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "the staging path is missing")
	}
	vid, ok := ParseVolumeID(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%q is not a volume id this driver made", req.GetVolumeId())
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	n := d.node
	nqns := []string{vid.SubsystemNQN()}
	staging := req.GetStagingTargetPath()
	if mounted, _ := isMounted(n.mounter, staging); mounted {
		// The export may carry an NQN of the operator's choosing: disconnect what is mounted.
		if dev, _, err := mountutils.GetDeviceNameFromMount(n.mounter, staging); err == nil {
			if nqn := nvme.SubsystemOf(dev); nqn != "" && nqn != nqns[0] {
				nqns = append(nqns, nqn)
			}
		}
	}
	if err := mountutils.CleanupMountPoint(staging, n.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", staging, err)
	}
	for _, nqn := range nqns {
		if err := nvme.Disconnect(ctx, nqn); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume bind-mounts the staged filesystem (or the raw device) at the target path,
// read-only where asked.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "the target path is missing")
	case req.GetVolumeCapability() == nil:
		return nil, status.Error(codes.InvalidArgument, "the volume capability is missing")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "the staging path is missing (this driver stages volumes first)")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	n := d.node
	target := req.GetTargetPath()
	if mounted, _ := isMounted(n.mounter, target); mounted {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	opts := []string{"bind"}
	if req.GetReadonly() || readOnlyMode(req.GetVolumeCapability()) {
		opts = append(opts, "ro")
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		uuid := req.GetPublishContext()[CtxUUID]
		dev, ok := nvme.FindNamespace(uuid)
		if !ok {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged: no namespace with UUID %q is attached", req.GetVolumeId(), uuid)
		}
		if err := touch(target); err != nil {
			return nil, status.Errorf(codes.Internal, "making the target file: %v", err)
		}
		if err := n.mounter.Mount(dev, target, "", opts); err != nil {
			return nil, status.Errorf(codes.Internal, "bind-mounting %s at %s: %v", dev, target, err)
		}
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if mounted, _ := isMounted(n.mounter, req.GetStagingTargetPath()); !mounted {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", req.GetVolumeId(), req.GetStagingTargetPath())
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "making the target path: %v", err)
	}
	if err := n.mounter.Mount(req.GetStagingTargetPath(), target, "", opts); err != nil {
		return nil, status.Errorf(codes.Internal, "bind-mounting %s at %s: %v", req.GetStagingTargetPath(), target, err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func touch(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o640)
	if err != nil {
		return err
	}
	return f.Close()
}

// NodeUnpublishVolume unmounts the target path and removes it; done already is fine.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "the target path is missing")
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := mountutils.CleanupMountPoint(req.GetTargetPath(), d.node.mounter, true); err != nil {
		return nil, status.Errorf(codes.Internal, "unmounting %s: %v", req.GetTargetPath(), err)
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.cfg.NodeID,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{ZoneKey: d.cfg.Zone}},
	}, nil
}

func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}
