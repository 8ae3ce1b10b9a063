package driver

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// StorageClass parameters.
const (
	ParamPool       = "pool"          // a pool name: only pools of that name are used
	ParamLevel      = "level"         // a RAID level (raid6, raid10, ...): only such pools
	ParamRedundancy = "minRedundancy" // drive failures a pool must survive (0, 1 or 2)
)

// Keys of the volume context (set at creation, handed to the node at stage and publish) and
// of the publish context (set by ControllerPublish: where the node connects).
const (
	CtxServer     = "millrace.dev/server" // the server's API URL (the volume id names it too)
	CtxPool       = "millrace.dev/pool"
	CtxUUID       = "millrace.dev/uuid" // the volume's UUID: the namespace's UUID and NGUID
	CtxStrip      = "millrace.dev/strip-bytes"
	CtxFullStripe = "millrace.dev/full-stripe-bytes"

	PubTransport = "millrace.dev/transport"
	PubAddress   = "millrace.dev/address"
	PubPort      = "millrace.dev/port"
	PubNQN       = "millrace.dev/nqn"
)

// Keys of the Kubernetes secrets the driver reads: the StorageClass names one Secret as
// csi.storage.k8s.io/controller-publish-secret-name (the server learns the host's secrets before
// the node may connect) and the same Secret as csi.storage.k8s.io/node-stage-secret-name (the
// node's initiator authenticates with them). Values are as `nvme gen-dhchap-key` prints them.
const (
	SecretDHChap     = "dhchapSecret"     // the host's DH-HMAC-CHAP secret, DHHC-1:XX:...:
	SecretDHChapCtrl = "dhchapCtrlSecret" // the controller's, for bidirectional authentication
)

// dhchapSecrets reads a request's secrets: none, the host's, or both. A controller secret alone
// is refused, since bidirectional authentication starts from the host's own.
func dhchapSecrets(secrets map[string]string) (host, ctrl string, err error) {
	host, ctrl = strings.TrimSpace(secrets[SecretDHChap]), strings.TrimSpace(secrets[SecretDHChapCtrl])
	switch {
	case host == "" && ctrl != "":
		return "", "", fmt.Errorf("the secret has %s but no %s: bidirectional authentication needs the host's secret too", SecretDHChapCtrl, SecretDHChap)
	case host != "" && !strings.HasPrefix(host, "DHHC-1:"):
		return "", "", fmt.Errorf("the secret's %s is not a DH-HMAC-CHAP secret (DHHC-1:XX:BASE64:, as `nvme gen-dhchap-key` prints it)", SecretDHChap)
	case ctrl != "" && !strings.HasPrefix(ctrl, "DHHC-1:"):
		return "", "", fmt.Errorf("the secret's %s is not a DH-HMAC-CHAP secret (DHHC-1:XX:BASE64:, as `nvme gen-dhchap-key` prints it)", SecretDHChapCtrl)
	}
	return host, ctrl, nil
}

// TagName is the prop the driver tags its volumes with: the CSI name they were made for.
const TagName = "csi.name"

type placementParams struct {
	pool       string
	level      string
	redundancy int // -1: any
}

func parseParams(p map[string]string) (placementParams, error) {
	out := placementParams{redundancy: -1}
	for k, v := range p {
		switch {
		case k == ParamPool:
			out.pool = v
		case k == ParamLevel:
			if _, ok := levelRedundancy[strings.ToLower(v)]; !ok {
				return out, fmt.Errorf("parameter %s=%q is not a RAID level; use one of raid0, raid1, raid10, raid5, raid6, raid50, raid60", k, v)
			}
			out.level = strings.ToLower(v)
		case k == ParamRedundancy:
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 2 {
				return out, fmt.Errorf("parameter %s=%q must be 0, 1 or 2 (drive failures a pool survives)", k, v)
			}
			out.redundancy = n
		case strings.HasPrefix(k, "csi.storage.k8s.io/"):
			// The external-provisioner's own (fstype, secrets): not for the driver.
		default:
			return out, fmt.Errorf("parameter %q is not one this driver takes; the parameters are %s, %s and %s", k, ParamPool, ParamLevel, ParamRedundancy)
		}
	}
	return out, nil
}

// levelRedundancy is how many drive failures each level survives in every case.
var levelRedundancy = map[string]int{
	"raid0": 0, "raid1": 1, "raid10": 1, "raid5": 1, "raid50": 1, "raid6": 2, "raid60": 2,
}

// Filesystems NodeStage can make; the empty fs type means the default.
var fsTypes = map[string]bool{"": true, "xfs": true, "ext4": true}

const defaultFS = "xfs"

// checkCapabilities refuses what the driver cannot do: a volume is attached to one node at a
// time (single-node access modes), as a raw block device or as an xfs or ext4 filesystem.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return fmt.Errorf("volume capabilities are missing; give at least one")
	}
	for _, c := range caps {
		if err := checkCapability(c); err != nil {
			return err
		}
	}
	return nil
}

func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return fmt.Errorf("a volume capability is missing")
	}
	switch c.GetAccessMode().GetMode() {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:
	default:
		return fmt.Errorf("access mode %s is not supported: a Millrace volume is attached to one node at a time", c.GetAccessMode().GetMode())
	}
	switch t := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
	case *csi.VolumeCapability_Mount:
		if !fsTypes[t.Mount.GetFsType()] {
			return fmt.Errorf("filesystem %q is not supported; use xfs (the default) or ext4", t.Mount.GetFsType())
		}
	default:
		return fmt.Errorf("the volume capability names neither block nor mount access")
	}
	return nil
}

func readOnlyMode(c *csi.VolumeCapability) bool {
	return c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}
