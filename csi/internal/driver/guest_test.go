package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millrace.dev/csi/internal/blockfs"
	"millrace.dev/csi/internal/nvme"
)

// TestGuestDataOutlivesRestageAndNewVolumesAreBlank runs in the project's guest
// (tests/guest/csi-node.sh), where the kernel has the NVMe/TCP initiator, against a real
// `millrace serve` named by MILLRACE_GUEST_SERVER. Through the driver's own calls: a volume is
// staged (the kernel connects, xfs is made on the blank device) and published, a file is
// written, the volume is unstaged (disconnected) and staged again at another path, and the
// file reads back; the volume grows and so does its filesystem. Then the volume is deleted and
// a new one made where it lay: it must read as zeros (no trace of the old filesystem) and get a
// filesystem of its own.
func TestGuestDataOutlivesRestageAndNewVolumesAreBlank(t *testing.T) {
	url, node, dir := os.Getenv("MILLRACE_GUEST_SERVER"), os.Getenv("MILLRACE_GUEST_NODE"), os.Getenv("MILLRACE_GUEST_DIR")
	if url == "" {
		t.Skip("runs in the guest: tests/guest/csi-node.sh sets MILLRACE_GUEST_SERVER")
	}
	d, err := New(Config{Controller: true, Node: true, NodeID: node, Servers: []ServerConfig{{Name: "guest", URL: url, Zone: DefaultZone}}},
		slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fsCap := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "xfs"}}}
	blockCap := &csi.VolumeCapability{AccessMode: fsCap.AccessMode, AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	create := func(name string) *csi.Volume {
		r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{fsCap},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 512 << 20}})
		must("create "+name, err)
		return r.Volume
	}
	publish := func(v *csi.Volume) map[string]string {
		r, err := d.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.VolumeId, NodeId: node, VolumeCapability: fsCap})
		must("controller publish", err)
		return r.PublishContext
	}
	stage := func(v *csi.Volume, pc map[string]string, c *csi.VolumeCapability, staging, target string) {
		_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.VolumeId, PublishContext: pc, VolumeContext: v.VolumeContext,
			StagingTargetPath: staging, VolumeCapability: c})
		must("stage at "+staging, err)
		_, err = d.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.VolumeId, PublishContext: pc, VolumeContext: v.VolumeContext,
			StagingTargetPath: staging, TargetPath: target, VolumeCapability: c})
		must("publish at "+target, err)
	}
	unstage := func(v *csi.Volume, staging, target string) {
		_, err := d.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.VolumeId, TargetPath: target})
		must("unpublish", err)
		_, err = d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.VolumeId, StagingTargetPath: staging})
		must("unstage", err)
		id, _ := ParseVolumeID(v.VolumeId)
		if c := controllers(id.SubsystemNQN()); len(c) > 0 {
			t.Fatalf("still connected after unstage: %v", c)
		}
	}
	p := func(s string) string { return filepath.Join(dir, s) }

	v := create("guest-data")
	pc := publish(v)
	stage(v, pc, fsCap, p("staging-1"), p("target-1"))
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	must("write", os.WriteFile(p("target-1/data.bin"), data, 0o644))
	f, _ := os.Open(p("target-1/data.bin"))
	must("fsync", f.Sync())
	f.Close()
	unstage(v, p("staging-1"), p("target-1"))

	stage(v, pc, fsCap, p("staging-2"), p("target-2"))
	back, err := os.ReadFile(p("target-2/data.bin"))
	must("read back after restage", err)
	if !bytes.Equal(back, data) {
		t.Fatal("the file read back after unstage and restage differs from the one written")
	}
	before := fsBytes(t, p("target-2"))
	_, err = d.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.VolumeId, CapacityRange: &csi.CapacityRange{RequiredBytes: 768 << 20}, VolumeCapability: fsCap})
	must("controller expand", err)
	_, err = d.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: v.VolumeId, VolumePath: p("target-2"), CapacityRange: &csi.CapacityRange{RequiredBytes: 768 << 20}})
	must("node expand", err)
	if after := fsBytes(t, p("target-2")); after < before+200<<20 {
		t.Fatalf("the filesystem did not grow with the volume: %d then %d bytes", before, after)
	}
	unstage(v, p("staging-2"), p("target-2"))
	_, err = d.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.VolumeId, NodeId: node})
	must("controller unpublish", err)
	old, _ := ParseVolumeID(v.VolumeId)
	oldVol, err := d.byName["guest"].Volume(ctx, old.Pool, old.Volume)
	must("reading the old volume", err)
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.VolumeId})
	must("delete", err)

	// A new volume where the deleted one lay reads as zeros: no old filesystem, no old file.
	w := create("guest-next")
	id, _ := ParseVolumeID(w.VolumeId)
	newVol, err := d.byName["guest"].Volume(ctx, id.Pool, id.Volume)
	must("reading the new volume", err)
	if newVol.OffsetBytes != oldVol.OffsetBytes {
		t.Fatalf("the new volume lies at %d, not where the deleted one lay (%d)", newVol.OffsetBytes, oldVol.OffsetBytes)
	}
	pc = publish(w)
	stage(w, pc, blockCap, p("staging-3"), p("block-3"))
	dev, ok := nvme.FindNamespace(pc[CtxUUID])
	if !ok {
		t.Fatal("no namespace for the new volume")
	}
	found, _ := blockfs.Probe(ctx, dev)
	blank := found.Type == "" && allZero(t, p("block-3"), 8<<20)
	unstage(w, p("staging-3"), p("block-3"))
	if !blank {
		// The server handed out the deleted volume's data. The driver must neither mount it nor
		// overwrite it: NodeStage refuses, and the old filesystem is still there untouched.
		_, err := d.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: w.VolumeId, PublishContext: pc, VolumeContext: w.VolumeContext,
			StagingTargetPath: p("staging-x"), VolumeCapability: fsCap})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("NodeStage on a volume holding another volume's %s answered %v, not FailedPrecondition", found.Type, err)
		}
		if m, _ := isMounted(d.node.mounter, p("staging-x")); m {
			t.Fatal("the old filesystem was mounted")
		}
		if again, _ := blockfs.Probe(ctx, dev); again != found {
			t.Fatalf("the old data was changed: %+v, then %+v", found, again)
		}
		_, _ = d.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: w.VolumeId, StagingTargetPath: p("staging-x")})
		msg := fmt.Sprintf("the new volume holds the deleted volume's %s (UUID %s): the server handed out old data", found.Type, found.UUID)
		if os.Getenv("MILLRACE_GUEST_REQUIRE_BLANK") == "1" {
			t.Fatal(msg)
		}
		t.Log("KNOWN GAP until the server's allocation map lands (#17): " + msg + "; the driver refused it as it must")
	} else {
		stage(w, pc, fsCap, p("staging-4"), p("target-4"))
		if _, err := os.Stat(p("target-4/data.bin")); err == nil {
			t.Fatal("the old volume's file is on the new volume")
		}
		unstage(w, p("staging-4"), p("target-4"))
	}
	_, err = d.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: w.VolumeId, NodeId: node})
	must("controller unpublish", err)
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: w.VolumeId})
	must("delete", err)
}

func controllers(nqn string) []string {
	var out []string
	entries, _ := os.ReadDir(nvme.ClassNVMe)
	for _, e := range entries {
		b, _ := os.ReadFile(filepath.Join(nvme.ClassNVMe, e.Name(), "subsysnqn"))
		if strings.TrimSpace(string(b)) == nqn {
			out = append(out, e.Name())
		}
	}
	return out
}

func fsBytes(t *testing.T, path string) int64 {
	d := &Driver{}
	r, err := d.NodeGetVolumeStats(context.Background(), &csi.NodeGetVolumeStatsRequest{VolumeId: "mr1/s/p/v", VolumePath: path})
	if err != nil {
		t.Fatal(err)
	}
	return r.Usage[0].Total
}

func allZero(t *testing.T, path string, n int) bool {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, n)
	if _, err := io.ReadFull(f, buf); err != nil {
		t.Fatal(err)
	}
	return bytes.Count(buf, []byte{0}) == n
}
