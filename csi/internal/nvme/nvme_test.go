package nvme

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A sysfs tree as the kernel lays it out with native multipath: the head nvme0n1 and the hidden
// path node nvme0c0n1 both carry the namespace's ids; only the head is a device to use.
func TestNamespacesAreFoundByUUIDOrNGUIDNeverByOrder(t *testing.T) {
	root := t.TempDir()
	SysBlock, ClassNVMe = filepath.Join(root, "block"), filepath.Join(root, "class")
	write(t, filepath.Join(SysBlock, "nvme0c0n1", "uuid"), "aaaaaaaa-0000-0000-0000-000000000001")
	write(t, filepath.Join(SysBlock, "nvme0n1", "uuid"), "aaaaaaaa-0000-0000-0000-000000000001")
	write(t, filepath.Join(SysBlock, "nvme0n1", "size"), "2048")
	write(t, filepath.Join(SysBlock, "nvme1n1", "uuid"), "00000000-0000-0000-0000-000000000000")
	write(t, filepath.Join(SysBlock, "nvme1n1", "nguid"), "bbbbbbbb-0000-0000-0000-000000000002")
	write(t, filepath.Join(SysBlock, "nvme1n1", "device", "subsysnqn"), "nqn.x:b")
	if dev, ok := FindNamespace("AAAAAAAA-0000-0000-0000-000000000001"); !ok || dev != "/dev/nvme0n1" {
		t.Errorf("by UUID: %q %v", dev, ok)
	}
	if dev, ok := FindNamespace("bbbbbbbb000000000000000000000002"); !ok || dev != "/dev/nvme1n1" {
		t.Errorf("by NGUID: %q %v", dev, ok)
	}
	if _, ok := FindNamespace("cccccccc-0000-0000-0000-000000000003"); ok {
		t.Error("found a namespace that is not there")
	}
	if _, ok := FindNamespace(""); ok {
		t.Error("an empty UUID matched")
	}
	if SizeBytes("/dev/nvme0n1") != 2048*512 || SubsystemOf("/dev/nvme1n1") != "nqn.x:b" {
		t.Error("size or subsystem")
	}
	write(t, filepath.Join(ClassNVMe, "nvme0", "subsysnqn"), "nqn.x:a")
	write(t, filepath.Join(ClassNVMe, "nvme0", "state"), "live")
	write(t, filepath.Join(ClassNVMe, "nvme0", "address"), "traddr=10.0.0.5,trsvcid=4420,src_addr=10.0.0.9")
	write(t, filepath.Join(ClassNVMe, "nvme1", "subsysnqn"), "nqn.x:a")
	write(t, filepath.Join(ClassNVMe, "nvme1", "state"), "deleting")
	if c := controllers("nqn.x:a", &Target{Address: "10.0.0.5", Port: "4420"}); len(c) != 1 || c[0] != "nvme0" {
		t.Errorf("controllers: %v", c)
	}
	if c := controllers("nqn.x:a", &Target{Address: "10.0.0.5", Port: "4421"}); len(c) != 0 {
		t.Errorf("another port matched: %v", c)
	}
}

func TestHostIDs(t *testing.T) {
	etc := t.TempDir()
	n := "nqn.2014-08.org.nvmexpress:uuid:4d696c6c-7261-6365-0000-000000000001"
	if id := HostID(n, etc); id != "4d696c6c-7261-6365-0000-000000000001" {
		t.Errorf("from the NQN's UUID: %q", id)
	}
	write(t, filepath.Join(etc, "hostnqn"), n)
	write(t, filepath.Join(etc, "hostid"), "11111111-2222-3333-4444-555555555555")
	if id := HostID(n, etc); id != "11111111-2222-3333-4444-555555555555" {
		t.Errorf("the machine's own: %q", id)
	}
	a, b := HostID("nqn.2026-01.example:node-a", etc), HostID("nqn.2026-01.example:node-b", etc)
	if a == b || len(a) != 36 || a != HostID("nqn.2026-01.example:node-a", etc) {
		t.Errorf("derived ids %q %q", a, b)
	}
}

// Connect hands the secrets to nvme-cli and never repeats them: a stand-in `nvme` on PATH
// records its arguments and fails echoing them, as nvme-cli does with options it refuses.
func TestConnectPassesSecretsAndNeverSaysThem(t *testing.T) {
	bin := t.TempDir()
	ClassNVMe = filepath.Join(t.TempDir(), "class") // no controller: Connect must run nvme
	args := filepath.Join(bin, "args")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" > " + args + "\necho \"failed to connect: $*\" >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, "nvme"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	host, ctrl := "DHHC-1:00:aG9zdHNlY3JldGhvc3RzZWNyZXRob3N0c2VjcmV0MTIzNDU2Nzg=:", "DHHC-1:01:Y3RybHNlY3JldA==:"
	err := Connect(context.Background(), Target{Transport: "tcp", Address: "192.0.2.1", Port: "4420", NQN: "nqn.2026-11.dev.millrace:t.v"},
		Options{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1", HostID: "1", CtrlLossTmo: 1, ReconnectDelay: 1},
		Auth{Secret: host, CtrlSecret: ctrl})
	if err == nil {
		t.Fatal("a failing nvme connect succeeded")
	}
	got, rerr := os.ReadFile(args)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if !strings.Contains(string(got), "--dhchap-secret\n"+host+"\n") || !strings.Contains(string(got), "--dhchap-ctrl-secret\n"+ctrl+"\n") {
		t.Errorf("nvme was not given the secrets: %q", got)
	}
	if strings.Contains(err.Error(), host) || strings.Contains(err.Error(), ctrl) || !strings.Contains(err.Error(), "<secret>") {
		t.Errorf("the error says a secret, or hides nothing: %v", err)
	}
	// Without secrets, no authentication options at all.
	_ = Connect(context.Background(), Target{Transport: "tcp", Address: "192.0.2.1", Port: "4420", NQN: "nqn.2026-11.dev.millrace:t.v"},
		Options{HostNQN: "nqn.2014-08.org.nvmexpress:uuid:1", HostID: "1"}, Auth{})
	if got, _ := os.ReadFile(args); strings.Contains(string(got), "dhchap") {
		t.Errorf("nvme was given authentication options without secrets: %q", got)
	}
}
