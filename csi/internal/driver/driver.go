// Package driver is the Millrace CSI driver: one type serving the Identity, Controller and Node
// services (one file each), over any number of independent Millrace servers.
package driver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"millrace.dev/csi/internal/millrace"
)

// Name is the plugin name Kubernetes knows the driver by.
const Name = "csi.millrace.dev"

// Version is set at build time (-ldflags "-X millrace.dev/csi/internal/driver.Version=...").
var Version = "0.1.0"

// Topology: one key, the zone. A node reports one value per key, so a key per server would tie
// each node to one server; with zones, every node reaches every server of its zone.
const (
	ZoneKey     = "millrace.dev/zone"
	DefaultZone = "default"
)

// ServerConfig is one Millrace server: --server URL[,zone=NAME][,name=NAME].
type ServerConfig struct {
	Name, URL, Zone string
}

// ParseServer reads one --server value.
func ParseServer(v string) (ServerConfig, error) {
	parts := strings.Split(v, ",")
	u, err := url.Parse(parts[0])
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ServerConfig{}, fmt.Errorf("--server %q: the first part must be the server's API URL, like http://10.0.0.5:8740", v)
	}
	s := ServerConfig{Name: u.Host, URL: parts[0], Zone: DefaultZone}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		switch {
		case ok && k == "zone" && val != "":
			s.Zone = val
		case ok && k == "name" && val != "" && !strings.ContainsAny(val, "/ "):
			s.Name = val
		default:
			return ServerConfig{}, fmt.Errorf("--server %q: %q is not an option; the options are zone=NAME and name=NAME (no '/' or spaces)", v, p)
		}
	}
	return s, nil
}

// Config is what the flags say.
type Config struct {
	Endpoint   string
	NodeID     string
	Zone       string
	Servers    []ServerConfig
	Token      string
	Controller bool
	Node       bool
	// APITimeout bounds each call to a server; AttachTimeout bounds NodeStage's wait for the
	// namespace to appear after connecting.
	APITimeout    time.Duration
	AttachTimeout time.Duration
}

// Driver serves the three CSI services.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer

	cfg     Config
	servers []*server
	byName  map[string]*server
	locks   *keyLocks
	log     *slog.Logger
	node    *nodeOps

	// reserved remembers where a CSI name was placed before the create call goes out, so a
	// retry (after a timeout) goes back to that server rather than placing the volume twice.
	resMu    sync.Mutex
	reserved map[string]VolumeID
}

type server struct {
	*millrace.Client
	zone string
}

// New checks the configuration and builds the driver.
func New(cfg Config, log *slog.Logger) (*Driver, error) {
	if cfg.APITimeout == 0 {
		cfg.APITimeout = 10 * time.Second
	}
	if cfg.AttachTimeout == 0 {
		cfg.AttachTimeout = 60 * time.Second
	}
	if cfg.Zone == "" {
		cfg.Zone = DefaultZone
	}
	d := &Driver{cfg: cfg, byName: map[string]*server{}, locks: newKeyLocks(), log: log, reserved: map[string]VolumeID{}}
	if cfg.Controller && len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("the controller needs at least one --server URL (a Millrace server's API)")
	}
	for _, s := range cfg.Servers {
		if _, dup := d.byName[s.Name]; dup {
			return nil, fmt.Errorf("two --server flags are named %s; give one of them name=OTHER", s.Name)
		}
		c, err := millrace.New(s.Name, s.URL, cfg.Token, cfg.APITimeout)
		if err != nil {
			return nil, err
		}
		srv := &server{Client: c, zone: s.Zone}
		d.servers = append(d.servers, srv)
		d.byName[s.Name] = srv
	}
	if cfg.Node {
		if !isNQN(cfg.NodeID) {
			return nil, fmt.Errorf("--node-id %q is not an NVMe host NQN (like nqn.2014-08.org.nvmexpress:uuid:...; `cat /etc/nvme/hostnqn` shows this node's)", cfg.NodeID)
		}
		d.node = newNodeOps(cfg.NodeID, cfg.AttachTimeout, log)
	}
	return d, nil
}

// isNQN applies NVMe's rules for a qualified name: "nqn." first, printable ASCII, at most 223
// bytes. Node ids that are not NQNs are unknown nodes.
func isNQN(s string) bool {
	if !strings.HasPrefix(s, "nqn.") || len(s) > 223 {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// Run serves on the endpoint until ctx ends.
func (d *Driver) Run(ctx context.Context) error {
	u, err := url.Parse(d.cfg.Endpoint)
	if err != nil || u.Scheme != "unix" || (u.Path == "" && u.Host == "") {
		return fmt.Errorf("--endpoint %q: give a unix socket, like unix:///csi/csi.sock", d.cfg.Endpoint)
	}
	path := u.Path
	if u.Host != "" {
		path = filepath.Join(u.Host, u.Path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	// A socket left by an earlier run of the driver; anything else there is not ours to remove.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("%s exists and is not a socket; remove it or pick another --endpoint", path)
		}
		_ = os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w", path, err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(g, d)
	if d.cfg.Controller {
		csi.RegisterControllerServer(g, d)
	}
	if d.cfg.Node {
		csi.RegisterNodeServer(g, d)
	}
	go func() {
		<-ctx.Done()
		g.GracefulStop()
	}()
	d.log.Info("serving", "endpoint", d.cfg.Endpoint, "controller", d.cfg.Controller, "node", d.cfg.Node, "servers", len(d.servers))
	return g.Serve(l)
}

func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	t0 := time.Now()
	resp, err := h(ctx, req)
	if err != nil {
		d.log.Warn("call failed", "method", info.FullMethod, "ms", time.Since(t0).Milliseconds(), "error", err)
	} else {
		d.log.Debug("call", "method", info.FullMethod, "ms", time.Since(t0).Milliseconds())
	}
	return resp, err
}
