package driver

import (
	"context"
	"io"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	mountutils "k8s.io/mount-utils"

	"millrace.dev/csi/internal/blockfs"
	"millrace.dev/csi/internal/nvme"
)

// NodeGetVolumeStats reports a filesystem's bytes and inodes, or a raw volume's size.
func (d *Driver) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume path is missing")
	}
	if _, ok := ParseVolumeID(req.GetVolumeId()); !ok {
		return nil, status.Errorf(codes.NotFound, "%q is not a volume id this driver made", req.GetVolumeId())
	}
	path := req.GetVolumePath()
	fi, err := os.Stat(path)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not at %s: %v", req.GetVolumeId(), path, err)
	}
	if fi.Mode()&os.ModeDevice != 0 {
		size, err := deviceSize(path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "reading the size of %s: %v", path, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{Unit: csi.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, status.Errorf(codes.Internal, "statfs %s: %v", path, err)
	}
	bs := int64(st.Bsize)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
		{Unit: csi.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
	}}, nil
}

// deviceSize is a block device's size: seeking to its end says it without an ioctl.
func deviceSize(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// NodeExpandVolume has the kernel read the grown namespace's size and grows the filesystem on
// it to fill it; a raw volume only needs the first.
func (d *Driver) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume id is missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "the volume path is missing")
	}
	vid, ok := ParseVolumeID(req.GetVolumeId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "%q is not a volume id this driver made", req.GetVolumeId())
	}
	path := req.GetVolumePath()
	fi, err := os.Stat(path)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s is not at %s: %v", req.GetVolumeId(), path, err)
	}
	unlock, err := d.locks.lock(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	n := d.node
	dev := nvme.DeviceOf(path)
	if fi.Mode()&os.ModeDevice == 0 {
		dev, _, err = mountutils.GetDeviceNameFromMount(n.mounter, path)
		if err != nil || dev == "" {
			return nil, status.Errorf(codes.FailedPrecondition, "nothing is mounted at %s", path)
		}
	}
	if dev == "" {
		return nil, status.Errorf(codes.FailedPrecondition, "%s is not an attached NVMe namespace", path)
	}
	nqn := nvme.SubsystemOf(dev)
	if nqn == "" {
		nqn = vid.SubsystemNQN()
	}
	want := req.GetCapacityRange().GetRequiredBytes()
	nvme.Rescan(nqn)
	deadline := time.Now().Add(n.attach)
	for nvme.SizeBytes(dev) < want && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	size := nvme.SizeBytes(dev)
	if size < want {
		return nil, status.Errorf(codes.Internal, "%s is still %d bytes, not the %d asked for; was the volume grown (ControllerExpandVolume)?", dev, size, want)
	}
	if fi.Mode()&os.ModeDevice == 0 && req.GetVolumeCapability().GetBlock() == nil {
		found, err := blockfs.Probe(ctx, dev)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if err := blockfs.Grow(ctx, found.Type, dev, path); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
