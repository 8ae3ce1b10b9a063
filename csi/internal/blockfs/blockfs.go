// Package blockfs decides what a newly attached volume holds, makes its filesystem only when it
// is blank, and grows and measures filesystems, with the stock tools (blkid, mkfs.xfs,
// mkfs.ext4, xfs_growfs, resize2fs).
package blockfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// Found is what blkid's low-level probe found on a device: a filesystem (or other signature:
// a partition table, RAID member, LVM) with its type and UUID; Type is "" when it found none.
type Found struct {
	Type, UUID string
}

// Probe runs `blkid -p`, which reads the device itself (no cache): exit 2 means no signature.
func Probe(ctx context.Context, dev string) (Found, error) {
	out, err := exec.CommandContext(ctx, "blkid", "-p", "-o", "export", dev).Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return Found{}, nil
	}
	if err != nil {
		return Found{}, fmt.Errorf("blkid -p %s: %v", dev, err)
	}
	var f Found
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "TYPE":
			f.Type = v
		case "PTTYPE":
			if f.Type == "" {
				f.Type = "partition table " + v
			}
		case "UUID":
			f.UUID = v
		}
	}
	if f.Type == "" {
		f.Type = "an unnamed signature"
	}
	return f, nil
}

// edgeBytes is how much of each end of a device IsZero reads: where filesystems, partition
// tables and RAID metadata keep their headers and backups.
const edgeBytes = 1 << 20

// IsZero tells whether the first and last MiB of the device are all zero bytes.
func IsZero(dev string) (bool, error) {
	f, err := os.Open(dev)
	if err != nil {
		return false, err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, err
	}
	buf := make([]byte, edgeBytes)
	zero := make([]byte, edgeBytes)
	for _, at := range []int64{0, max(size-edgeBytes, 0)} {
		n, err := f.ReadAt(buf, at)
		if err != nil && !errors.Is(err, io.EOF) {
			return false, fmt.Errorf("reading %s at %d: %w", dev, at, err)
		}
		if !bytes.Equal(buf[:n], zero[:n]) {
			return false, nil
		}
	}
	return true, nil
}

// Geometry is the volume's RAID geometry, for a filesystem that writes whole stripes.
type Geometry struct {
	StripBytes, FullStripeBytes int64
}

// Mkfs makes an xfs or ext4 filesystem whose UUID is the volume's (so a later stage knows the
// filesystem is this volume's own), aligned to the stripes: xfs su = strip, sw = data strips
// per stripe (as shares do); ext4 stride and stripe width in 4 KiB blocks. No discard: the
// volume is blank already.
func Mkfs(ctx context.Context, dev, fsType, uuid string, g Geometry) error {
	var cmd string
	var args []string
	switch fsType {
	case "xfs":
		cmd, args = "mkfs.xfs", []string{"-q", "-K", "-m", "uuid=" + uuid}
		var data []string
		if g.StripBytes > 0 && g.FullStripeBytes >= g.StripBytes && g.FullStripeBytes%g.StripBytes == 0 {
			data = append(data, fmt.Sprintf("su=%d,sw=%d", g.StripBytes, g.FullStripeBytes/g.StripBytes))
		}
		if size, err := sizeOf(dev); err == nil && size < 1<<30 {
			// mkfs.xfs (since 5.19) wants a 64 MiB log inside one allocation group; under 1 GiB
			// its stripe-aligned default of 8 groups leaves them too small (as shares do).
			data = append(data, "agcount=4")
		}
		if len(data) > 0 {
			args = append(args, "-d", strings.Join(data, ","))
		}
	case "ext4":
		cmd, args = "mkfs.ext4", []string{"-q", "-F", "-U", uuid}
		ext := "nodiscard"
		if g.StripBytes >= 4096 && g.StripBytes%4096 == 0 && g.FullStripeBytes%4096 == 0 {
			ext += fmt.Sprintf(",stride=%d,stripe_width=%d", g.StripBytes/4096, g.FullStripeBytes/4096)
		}
		args = append(args, "-E", ext)
	default:
		return fmt.Errorf("cannot make a %q filesystem; use xfs or ext4", fsType)
	}
	args = append(args, dev)
	if out, err := exec.CommandContext(ctx, cmd, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", cmd, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func sizeOf(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

// Grow grows the filesystem mounted at mountpoint from dev to fill the device.
func Grow(ctx context.Context, fsType, dev, mountpoint string) error {
	var c *exec.Cmd
	switch fsType {
	case "xfs":
		c = exec.CommandContext(ctx, "xfs_growfs", mountpoint)
	case "ext4", "ext3", "ext2":
		c = exec.CommandContext(ctx, "resize2fs", dev)
	default:
		return fmt.Errorf("cannot grow a %q filesystem", fsType)
	}
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(c.Args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// SameUUID compares UUIDs as text, ignoring case and dashes.
func SameUUID(a, b string) bool {
	n := func(s string) string { return strings.ToLower(strings.ReplaceAll(s, "-", "")) }
	return n(a) != "" && n(a) == n(b)
}
