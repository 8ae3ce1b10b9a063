package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// A volume id names the server, the pool and the volume, so any controller replica (and any
// node, at unstage) can act on it from the id alone: "mr1/SERVER/POOL/VOLUME". Server names
// (host:port by default) and Millrace pool and volume names never hold a '/'.
const idPrefix = "mr1"

// VolumeID is a parsed volume id.
type VolumeID struct {
	Server, Pool, Volume string
}

func (v VolumeID) String() string {
	return strings.Join([]string{idPrefix, v.Server, v.Pool, v.Volume}, "/")
}

// ParseVolumeID reads an id made by String; ok is false for anything else.
func ParseVolumeID(id string) (VolumeID, bool) {
	p := strings.Split(id, "/")
	if len(p) != 4 || p[0] != idPrefix || p[1] == "" || !validName(p[2]) || !validName(p[3]) {
		return VolumeID{}, false
	}
	return VolumeID{Server: p[1], Pool: p[2], Volume: p[3]}, true
}

// NQNPrefix starts the subsystem NQN of every export the driver makes.
const NQNPrefix = "nqn.2026-11.dev.millrace:csi:"

// SubsystemNQN is the NQN the driver exports a volume under: derived from the id alone, so a
// node that is unstaging (and has only the id) finds its connections, and unique across
// servers (two servers may hold pools and volumes of the same names).
func (v VolumeID) SubsystemNQN() string {
	return NQNPrefix + v.Server + ":" + v.Pool + ":" + v.Volume
}

// Millrace volume names: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or
// digit (the server's own rule, crates/millrace-volume).
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func validName(s string) bool { return nameRE.MatchString(s) }

// VolumeName is the Millrace volume name for a CSI volume name: the name itself where it is a
// valid Millrace name (Kubernetes' "pvc-UUID" is), otherwise a readable prefix and a hash of
// the whole name, so that the same CSI name always maps to the same volume name.
func VolumeName(csiName string) string {
	if validName(csiName) {
		return csiName
	}
	sum := sha256.Sum256([]byte(csiName))
	clean := strings.Map(func(r rune) rune {
		if r < 128 && (r == '.' || r == '_' || r == '-' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9')) {
			return r
		}
		return '-'
	}, csiName)
	clean = strings.TrimLeft(clean, "._-")
	if len(clean) > 30 {
		clean = clean[:30]
	}
	return fmt.Sprintf("%s-%s", strings.TrimRight("c"+clean, "-"), hex.EncodeToString(sum[:])[:32])
}
