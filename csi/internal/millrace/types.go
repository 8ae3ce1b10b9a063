package millrace

import (
	"encoding/json"
	"net"
	"strconv"
)

// Status is GET /api/v1/status.
type Status struct {
	Version          string            `json:"version"`
	NVMeListeners    []Listener        `json:"nvme_listeners"`
	UnavailablePools map[string]string `json:"unavailable_pools"`
}

// Listener is where NVMe hosts connect: transport tcp (or rdma), an address (0.0.0.0 or ::
// for every address of the server) and a port.
type Listener struct {
	Transport string `json:"transport"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
}

// Unspecified tells whether the listener serves on every address of the server.
func (l Listener) Unspecified() bool {
	ip := net.ParseIP(l.Address)
	return ip == nil || ip.IsUnspecified()
}

// HostPort is the listener as host:port.
func (l Listener) HostPort() string { return net.JoinHostPort(l.Address, strconv.Itoa(l.Port)) }

// Pool is one pool as GET /api/v1/pools shows it (the fields the driver uses).
type Pool struct {
	Name               string   `json:"name"`
	Level              string   `json:"level"`
	State              string   `json:"state"`
	SizeBytes          int64    `json:"size_bytes"`
	StripBytes         int64    `json:"strip_bytes"`
	FullStripeBytes    int64    `json:"full_stripe_bytes"`
	DataDrivesPerGroup int      `json:"data_drives_per_group"`
	FreeBytes          int64    `json:"free_bytes"`
	LargestFreeBytes   int64    `json:"largest_free_bytes"`
	Volumes            []Volume `json:"volumes"`
}

// Volume is one volume; Props hold the tags of the layers above (the driver's csi.name, the
// NVMe/TCP export's settings under export.nvme).
type Volume struct {
	Name        string            `json:"name"`
	UUID        string            `json:"uuid"`
	OffsetBytes int64             `json:"offset_bytes"`
	SizeBytes   int64             `json:"size_bytes"`
	Props       map[string]string `json:"props"`
}

// NVMeExport is a volume's NVMe/TCP export.
type NVMeExport struct {
	NQN          string   `json:"nqn"`
	Hosts        []string `json:"hosts"`
	AllowAnyHost bool     `json:"allow_any_host"`
}

// ExportProp is the volume prop that holds its NVMe/TCP export.
const ExportProp = "export.nvme"

// Export is the volume's NVMe/TCP export, or nil when it has none.
func (v *Volume) Export() *NVMeExport {
	raw, ok := v.Props[ExportProp]
	if !ok {
		return nil
	}
	var e NVMeExport
	if json.Unmarshal([]byte(raw), &e) != nil {
		// Recorded but unreadable: still an export (the server refuses to delete the volume).
		return &NVMeExport{}
	}
	return &e
}
