package blockfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The stock tools on a sparse file standing in for a device: blank until a filesystem is made,
// and then that filesystem carries the volume's UUID, which is how a later stage knows it.
func TestBlankFilesGetAFilesystemWithTheVolumesUUID(t *testing.T) {
	for _, tool := range []string{"blkid", "mkfs.ext4", "dumpe2fs", "mkfs.xfs", "xfs_db"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing (scripts/setup.sh installs e2fsprogs, util-linux and xfsprogs)", tool)
		}
	}
	ctx := context.Background()
	dev := filepath.Join(t.TempDir(), "dev.img")
	if err := os.WriteFile(dev, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(dev, 64<<20); err != nil {
		t.Fatal(err)
	}
	if f, err := Probe(ctx, dev); err != nil || f.Type != "" {
		t.Fatalf("a blank file: %+v %v", f, err)
	}
	if z, err := IsZero(dev); err != nil || !z {
		t.Fatalf("a blank file is not zero: %v %v", z, err)
	}
	const uuid = "0a1b2c3d-4e5f-4071-8293-a4b5c6d7e8f9"
	if err := Mkfs(ctx, dev, "ext4", uuid, Geometry{StripBytes: 64 << 10, FullStripeBytes: 128 << 10}); err != nil {
		t.Fatal(err)
	}
	f, err := Probe(ctx, dev)
	if err != nil || f.Type != "ext4" || !SameUUID(f.UUID, uuid) {
		t.Fatalf("after mkfs: %+v %v", f, err)
	}
	if z, _ := IsZero(dev); z {
		t.Error("a device with a filesystem reads as blank")
	}
	out, err := exec.Command("dumpe2fs", "-h", dev).CombinedOutput()
	if err != nil || !contains(string(out), "RAID stripe width:        32") {
		t.Errorf("ext4 is not aligned to the stripe:\n%s", out)
	}
	// xfs on a small volume (under 1 GiB, where its default groups are too small for its log),
	// aligned to the stripe.
	small := filepath.Join(t.TempDir(), "small.img")
	if err := os.WriteFile(small, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(small, 512<<20); err != nil {
		t.Fatal(err)
	}
	if err := Mkfs(ctx, small, "xfs", uuid, Geometry{StripBytes: 64 << 10, FullStripeBytes: 128 << 10}); err != nil {
		t.Fatal(err)
	}
	if f, err := Probe(ctx, small); err != nil || f.Type != "xfs" || !SameUUID(f.UUID, uuid) {
		t.Fatalf("after mkfs.xfs: %+v %v", f, err)
	}
	out, err = exec.Command("xfs_db", "-r", "-c", "sb 0", "-c", "p unit width", small).CombinedOutput()
	if err != nil || !contains(string(out), "unit = 16") || !contains(string(out), "width = 32") {
		t.Errorf("xfs is not aligned to the stripe: %v\n%s", err, out)
	}
	// Data with no signature is not blank either.
	raw := filepath.Join(t.TempDir(), "raw.img")
	data := make([]byte, 8<<20)
	data[5] = 1
	if err := os.WriteFile(raw, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if f, _ := Probe(ctx, raw); f.Type != "" {
		t.Fatalf("a signature in one byte? %+v", f)
	}
	if z, _ := IsZero(raw); z {
		t.Error("data at the start reads as blank")
	}
	if Mkfs(ctx, raw, "btrfs", uuid, Geometry{}) == nil {
		t.Error("btrfs made")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
