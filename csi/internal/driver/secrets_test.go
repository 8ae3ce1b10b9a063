package driver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// newSecret makes a DH-HMAC-CHAP secret as `nvme gen-dhchap-key` does: 32 random bytes and
// their CRC-32 (little-endian), base64, under DHHC-1 with no transformation (00).
func newSecret(t *testing.T) string {
	t.Helper()
	key := make([]byte, 32, 36)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	key = binary.LittleEndian.AppendUint32(key, crc32.ChecksumIEEE(key))
	return "DHHC-1:00:" + base64.StdEncoding.EncodeToString(key) + ":"
}

// dhchapModes is what the server says of each host's authentication on a volume's export
// (none, host, bidirectional), from GET /api/v1/exports.
func dhchapModes(t *testing.T, url, pool, vol string) map[string]string {
	t.Helper()
	resp, err := http.Get(url + "/api/v1/exports")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		NVMe []struct {
			Pool   string            `json:"pool"`
			Volume string            `json:"volume"`
			DHChap map[string]string `json:"dhchap"`
		} `json:"nvme"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	for _, e := range list.NVMe {
		if e.Pool == pool && e.Volume == vol {
			return e.DHChap
		}
	}
	t.Fatalf("the server lists no NVMe export of %s/%s", pool, vol)
	return nil
}

// TestPublishSecretsReachTheServerAndNeverTheLog runs against a real `millrace serve` named by
// MILLRACE_TEST_SERVER (tests/csi/sanity.sh starts one). A ControllerPublish carrying a
// Kubernetes secret with the host's and the controller's DH-HMAC-CHAP secrets leaves the node on
// the export authenticating both ways; published again with a rotated secret it still is;
// a secret that is not DHHC-1, or a controller secret alone, is refused before the server is
// asked; and no secret appears in an error or in the driver's log.
func TestPublishSecretsReachTheServerAndNeverTheLog(t *testing.T) {
	url := os.Getenv("MILLRACE_TEST_SERVER")
	if url == "" {
		t.Skip("needs a running server: tests/csi/sanity.sh sets MILLRACE_TEST_SERVER")
	}
	var logged bytes.Buffer
	d, err := New(Config{Controller: true, Servers: []ServerConfig{{Name: "test", URL: url, Zone: DefaultZone}}},
		slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	node := "nqn.2014-08.org.nvmexpress:uuid:6d696c6c-7261-6365-6373-6900000000a7"
	capab := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	r, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "dhchap-publish", VolumeCapabilities: []*csi.VolumeCapability{capab},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	id := r.Volume.VolumeId
	vid, _ := ParseVolumeID(id)
	defer func() {
		_, _ = d.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: node})
		if _, err := d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	publish := func(secrets map[string]string) error {
		_, err := d.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node,
			VolumeCapability: capab, Secrets: secrets})
		return err
	}
	var said []string
	host, ctrl := newSecret(t), newSecret(t)
	if err := publish(map[string]string{SecretDHChap: host, SecretDHChapCtrl: ctrl}); err != nil {
		t.Fatalf("publish with both secrets: %v", err)
	}
	if m := dhchapModes(t, url, vid.Pool, vid.Volume); m[node] != "bidirectional" {
		t.Fatalf("after a publish with both secrets the export says %v of %s, not bidirectional", m, node)
	}
	rotated := newSecret(t)
	if err := publish(map[string]string{SecretDHChap: rotated}); err != nil {
		t.Fatalf("publish again with a rotated host secret: %v", err)
	}
	if m := dhchapModes(t, url, vid.Pool, vid.Volume); m[node] != "host" {
		t.Fatalf("after a publish with the host's secret alone the export says %v of %s, not host", m, node)
	}
	for what, secrets := range map[string]map[string]string{
		"a controller secret alone":   {SecretDHChapCtrl: ctrl},
		"a secret that is not DHHC-1": {SecretDHChap: "hunter2-" + host[10:30]},
	} {
		err := publish(secrets)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: got %v, want InvalidArgument", what, err)
		}
		if err != nil {
			said = append(said, err.Error())
		}
	}
	// The server checks what the driver cannot: a DHHC-1 secret whose CRC is wrong.
	broken := host[:20] + strings.ToUpper(host[20:21]) + host[21:]
	if broken == host {
		broken = host[:20] + strings.ToLower(host[20:21]) + host[21:]
	}
	if broken != host {
		err := publish(map[string]string{SecretDHChap: broken})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("a secret with a wrong CRC: got %v, want InvalidArgument", err)
		}
		if err != nil {
			said = append(said, err.Error())
		}
	}
	said = append(said, logged.String())
	for _, s := range said {
		for _, k := range []string{host, ctrl, rotated, broken, host[10:30]} {
			if strings.Contains(s, k) || strings.Contains(s, k[10:len(k)-1]) {
				t.Errorf("a secret was said: %q", s)
			}
		}
	}
}
