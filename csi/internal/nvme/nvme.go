// Package nvme attaches NVMe/TCP namespaces with the stock kernel initiator: nvme-cli connects
// and disconnects, and the kernel's sysfs (never /dev/nvmeXnY order) says which block device
// is which namespace.
package nvme

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Target is where a namespace is served: a subsystem at an address.
type Target struct {
	Transport, Address, Port, NQN string
}

// Options are the initiator's settings for a connection.
type Options struct {
	HostNQN string
	HostID  string
	// CtrlLossTmo is how long (seconds) the kernel keeps retrying a lost connection before it
	// fails I/O; ReconnectDelay the seconds between tries.
	CtrlLossTmo    int
	ReconnectDelay int
}

// Auth is a connection's DH-HMAC-CHAP secrets (empty: none): the host's, and the controller's
// for bidirectional authentication.
type Auth struct {
	Secret, CtrlSecret string
}

// redact hides secrets in what is said about a command (its arguments, nvme-cli's output):
// errors reach logs and Kubernetes events.
func (a Auth) redact(s string) string {
	for _, k := range []string{a.Secret, a.CtrlSecret} {
		if k != "" {
			s = strings.ReplaceAll(s, k, "<secret>")
		}
	}
	return s
}

// Sysfs roots; tests point them at a fake tree.
var (
	ClassNVMe = "/sys/class/nvme"
	SysBlock  = "/sys/block"
)

func read(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// controllers lists the kernel's controllers (nvme0, nvme1, ...) connected to subsystem nqn,
// optionally at this address (empty: any).
func controllers(nqn string, t *Target) []string {
	entries, _ := os.ReadDir(ClassNVMe)
	var out []string
	for _, e := range entries {
		dir := filepath.Join(ClassNVMe, e.Name())
		if read(filepath.Join(dir, "subsysnqn")) != nqn {
			continue
		}
		if st := read(filepath.Join(dir, "state")); st == "deleting" || st == "dead" {
			continue
		}
		if t != nil {
			addr := read(filepath.Join(dir, "address"))
			if !strings.Contains(addr, "traddr="+t.Address) || !strings.Contains(addr, "trsvcid="+t.Port) {
				continue
			}
		}
		out = append(out, e.Name())
	}
	return out
}

// Connect connects to the target unless this node already is (the kernel goes on
// reconnecting a controller that lost its connection, so one in any live state counts),
// authenticating with the secrets in a when it has them.
func Connect(ctx context.Context, t Target, o Options, a Auth) error {
	if len(controllers(t.NQN, &t)) > 0 {
		return nil
	}
	args := []string{"connect", "-t", t.Transport, "-a", t.Address, "-s", t.Port, "-n", t.NQN,
		"--hostnqn", o.HostNQN, "--hostid", o.HostID,
		"--ctrl-loss-tmo", fmt.Sprint(o.CtrlLossTmo), "--reconnect-delay", fmt.Sprint(o.ReconnectDelay)}
	if a.Secret != "" {
		args = append(args, "--dhchap-secret", a.Secret)
	}
	if a.CtrlSecret != "" {
		args = append(args, "--dhchap-ctrl-secret", a.CtrlSecret)
	}
	out, err := exec.CommandContext(ctx, "nvme", args...).CombinedOutput()
	if err != nil {
		if len(controllers(t.NQN, &t)) > 0 {
			return nil // connected meanwhile ("already connected")
		}
		said := fmt.Sprintf("nvme %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		return fmt.Errorf("%s", a.redact(said))
	}
	return nil
}

// Disconnect disconnects every controller of subsystem nqn; none is fine.
func Disconnect(ctx context.Context, nqn string) error {
	for _, c := range controllers(nqn, nil) {
		out, err := exec.CommandContext(ctx, "nvme", "disconnect", "-d", c).CombinedOutput()
		if err != nil && len(controllers(nqn, nil)) > 0 {
			return fmt.Errorf("nvme disconnect -d %s (%s): %v: %s", c, nqn, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Namespace block devices: nvme0n1, not the hidden per-path nodes of native multipath
// (nvme0c1n1), which have no /dev entry.
var nsName = regexp.MustCompile(`^nvme[0-9]+n[0-9]+$`)

func normUUID(s string) string {
	return strings.ToLower(strings.ReplaceAll(strings.TrimSpace(s), "-", ""))
}

// FindNamespace is the block device (/dev/nvmeXnY) whose namespace UUID or NGUID is uuid.
func FindNamespace(uuid string) (string, bool) {
	want := normUUID(uuid)
	if want == "" {
		return "", false
	}
	entries, _ := os.ReadDir(SysBlock)
	for _, e := range entries {
		if !nsName.MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(SysBlock, e.Name())
		if normUUID(read(filepath.Join(dir, "uuid"))) == want || normUUID(read(filepath.Join(dir, "nguid"))) == want {
			return "/dev/" + e.Name(), true
		}
	}
	return "", false
}

// WaitNamespace waits until the namespace with this UUID has a block device.
func WaitNamespace(ctx context.Context, uuid string, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if dev, ok := FindNamespace(uuid); ok {
			if _, err := os.Stat(dev); err == nil {
				return dev, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no block device with namespace UUID %s appeared within %s of connecting", uuid, timeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// DeviceOf is the /dev/nvmeXnY that path is (a device node anywhere, such as the bind-mounted
// file of a raw block volume), found through its device numbers; "" when it is none.
func DeviceOf(path string) string {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return ""
	}
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	if err != nil {
		return ""
	}
	return "/dev/" + filepath.Base(link)
}

// SubsystemOf is the subsystem NQN of block device dev (/dev/nvme0n1), or "".
func SubsystemOf(dev string) string {
	return read(filepath.Join(SysBlock, filepath.Base(dev), "device", "subsysnqn"))
}

// SizeBytes is the block device's size as the kernel knows it now.
func SizeBytes(dev string) int64 {
	var sectors int64
	_, _ = fmt.Sscan(read(filepath.Join(SysBlock, filepath.Base(dev), "size")), &sectors)
	return sectors * 512
}

// Rescan asks the controllers of subsystem nqn to read their namespaces' sizes again (after
// the volume grew; the target also says so with an event, this does not wait for it).
func Rescan(nqn string) {
	for _, c := range controllers(nqn, nil) {
		_ = os.WriteFile(filepath.Join(ClassNVMe, c, "rescan_controller"), []byte("1"), 0o200)
	}
}

// HostID is the host identifier to connect with: the one in /etc/nvme/hostid when
// /etc/nvme/hostnqn is this NQN (the kernel refuses one NQN with two ids), else the UUID in a
// nqn.2014-08.org.nvmexpress:uuid:UUID name, else one derived from the NQN (stable).
func HostID(hostNQN, etc string) string {
	if read(filepath.Join(etc, "hostnqn")) == hostNQN {
		if id := read(filepath.Join(etc, "hostid")); id != "" {
			return id
		}
	}
	if _, u, ok := strings.Cut(hostNQN, ":uuid:"); ok && len(normUUID(u)) == 32 {
		return strings.ToLower(u)
	}
	s := sha256.Sum256([]byte(hostNQN))
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}
