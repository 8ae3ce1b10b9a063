// Command millrace-csi is the Kubernetes CSI driver for Millrace servers (plugin name
// csi.millrace.dev): volumes placed across many independent Millrace servers, attached to
// nodes with the kernel's NVMe/TCP initiator.
//
//	millrace-csi --endpoint unix:///csi/csi.sock --mode controller \
//	    --server http://10.0.0.5:8740,zone=a --server http://10.0.0.6:8740,zone=b
//	millrace-csi --endpoint unix:///csi/csi.sock --mode node --node-id "$(cat /etc/nvme/hostnqn)" --zone a
//
// The API token comes from MILLRACE_TOKEN.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"millrace.dev/csi/internal/driver"
)

type serverFlags []driver.ServerConfig

func (s *serverFlags) String() string { return fmt.Sprint(*s) }

func (s *serverFlags) Set(v string) error {
	c, err := driver.ParseServer(v)
	if err != nil {
		return err
	}
	*s = append(*s, c)
	return nil
}

func main() {
	var servers serverFlags
	endpoint := flag.String("endpoint", "unix:///csi/csi.sock", "the CSI socket: unix:///path/csi.sock")
	nodeID := flag.String("node-id", "", "this node's NVMe host NQN (node mode); default: /etc/nvme/hostnqn")
	zone := flag.String("zone", driver.DefaultZone, "this node's zone (topology key "+driver.ZoneKey+")")
	mode := flag.String("mode", "all", "which services to serve: controller, node or all")
	apiTimeout := flag.Duration("api-timeout", 10*time.Second, "the longest one call to a Millrace server may take")
	attachTimeout := flag.Duration("attach-timeout", 60*time.Second, "how long NodeStage waits for the namespace after connecting")
	verbose := flag.Bool("v", false, "log every call, not only failures")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Var(&servers, "server", "a Millrace server: URL[,zone=NAME][,name=NAME] (repeat for each server)")
	flag.Parse()
	if *version {
		fmt.Println(driver.Name, driver.Version)
		return
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg := driver.Config{
		Endpoint: *endpoint, NodeID: *nodeID, Zone: *zone, Servers: servers,
		Token: os.Getenv("MILLRACE_TOKEN"), APITimeout: *apiTimeout, AttachTimeout: *attachTimeout,
	}
	switch *mode {
	case "controller":
		cfg.Controller = true
	case "node":
		cfg.Node = true
	case "all":
		cfg.Controller, cfg.Node = true, true
	default:
		fail(fmt.Errorf("--mode %q: use controller, node or all", *mode))
	}
	if cfg.Node && cfg.NodeID == "" {
		b, err := os.ReadFile("/etc/nvme/hostnqn")
		if err != nil {
			fail(fmt.Errorf("--node-id is not given and /etc/nvme/hostnqn cannot be read (%v); give this node's NVMe host NQN", err))
		}
		cfg.NodeID = strings.TrimSpace(string(b))
	}
	d, err := driver.New(cfg, log)
	if err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := d.Run(ctx); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "millrace-csi:", err)
	os.Exit(2)
}
