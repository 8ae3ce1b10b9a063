package driver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"millrace.dev/csi/internal/millrace"
)

func TestVolumeIDsRoundTripAndRefuseOthers(t *testing.T) {
	id := VolumeID{Server: "10.0.0.5:8740", Pool: "tank", Volume: "pvc-0a1b"}
	got, ok := ParseVolumeID(id.String())
	if !ok || got != id {
		t.Fatalf("%q parsed as %+v, %v", id.String(), got, ok)
	}
	for _, bad := range []string{"", "fake-vol-id", "mr1/a/b", "mr2/s/p/v", "mr1//p/v", "mr1/s/p/v/x", "mr1/s/-p/v", "mr1/s/p/v w"} {
		if _, ok := ParseVolumeID(bad); ok {
			t.Errorf("%q parsed as a volume id", bad)
		}
	}
	if nqn := id.SubsystemNQN(); !isNQN(nqn) || !strings.HasSuffix(nqn, ":tank:pvc-0a1b") {
		t.Errorf("subsystem NQN %q", nqn)
	}
}

func TestVolumeNamesAreValidStableAndDistinct(t *testing.T) {
	if VolumeName("pvc-5f8e0c1e-3b7a-4d7e-9c5e-1f2a3b4c5d6e") != "pvc-5f8e0c1e-3b7a-4d7e-9c5e-1f2a3b4c5d6e" {
		t.Error("a valid name is not kept as it is")
	}
	long := strings.Repeat("sanity-controller-create-", 8)
	for _, n := range []string{long, long + "x", "-leading", "with space", "ünïcode", strings.Repeat("z", 200)} {
		v := VolumeName(n)
		if !validName(v) {
			t.Errorf("%q maps to the invalid volume name %q", n, v)
		}
		if VolumeName(n) != v {
			t.Errorf("%q maps to two names", n)
		}
	}
	if VolumeName(long) == VolumeName(long+"x") {
		t.Error("two CSI names map to one volume")
	}
}

func view(name, zone string, err error, pools ...millrace.Pool) serverView {
	c, _ := millrace.New(name, "http://"+name, "", 0)
	return serverView{srv: &server{Client: c, zone: zone}, pools: pools, err: err}
}

func pool(name, level string, free int64) millrace.Pool {
	return millrace.Pool{Name: name, Level: level, State: "online", FullStripeBytes: 128 << 10, FreeBytes: free, LargestFreeBytes: free}
}

func TestPlacementTakesTheMostFreeSpaceInAllowedZones(t *testing.T) {
	any := placementParams{redundancy: -1}
	views := []serverView{
		view("a:1", "east", nil, pool("tank", "raid6", 10<<30), pool("big", "raid0", 50<<30)),
		view("b:1", "west", nil, pool("tank", "raid5", 30<<30)),
		view("c:1", "west", errors.New("connection refused")),
	}
	pick := func(pp placementParams, size int64, allowed map[string]bool, pref string) string {
		c := place(views, pp, size, 0, allowed, pref)
		if c == nil {
			return ""
		}
		return c.srv.Name + "/" + c.pool.Name
	}
	if got := pick(any, 1<<30, nil, ""); got != "a:1/big" {
		t.Errorf("most free space: got %q", got)
	}
	if got := pick(any, 1<<30, map[string]bool{"west": true}, ""); got != "b:1/tank" {
		t.Errorf("zone west: got %q", got)
	}
	if got := pick(any, 1<<30, nil, "west"); got != "b:1/tank" {
		t.Errorf("the preferred zone first: got %q", got)
	}
	if got := pick(any, 40<<30, nil, "west"); got != "a:1/big" {
		t.Errorf("the preferred zone has no room: got %q", got)
	}
	if got := pick(placementParams{redundancy: 2}, 1<<30, nil, ""); got != "a:1/tank" {
		t.Errorf("minRedundancy 2: got %q", got)
	}
	if got := pick(placementParams{level: "raid5", redundancy: -1}, 1<<30, nil, ""); got != "b:1/tank" {
		t.Errorf("level raid5: got %q", got)
	}
	if got := pick(any, 60<<30, nil, ""); got != "" {
		t.Errorf("nothing holds 60 GiB, got %q", got)
	}
	// A size that fits only unrounded is refused where the stripe rounds it past the free range.
	tight := []serverView{view("d:1", "east", nil, pool("t", "raid5", 1<<20))}
	if c := place(tight, any, 1<<20+1, 0, nil, ""); c != nil {
		t.Error("placed a volume that does not fit once rounded to whole stripes")
	}
	if c := place(tight, any, 1<<20, 512<<10, nil, ""); c != nil {
		t.Error("placed a volume above the limit")
	}
}

func TestNoRoomSaysWhy(t *testing.T) {
	d := &Driver{}
	any := placementParams{redundancy: -1}
	down := []serverView{view("a:1", "east", nil, pool("tank", "raid6", 1<<20)), view("c:1", "east", errors.New("millrace server c:1 does not answer"))}
	err := d.noRoom(down, any, 1<<30, nil)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "c:1") {
		t.Errorf("a server down: %v", err)
	}
	up := down[:1]
	if err := d.noRoom(up, any, 1<<30, nil); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("no room: %v", err)
	}
	if err := d.noRoom(up, placementParams{pool: "nope", redundancy: -1}, 1, nil); status.Code(err) != codes.InvalidArgument {
		t.Errorf("no such pool: %v", err)
	}
	// A server down in a zone the volume may not go to is not the reason.
	if err := d.noRoom(down, any, 1<<30, map[string]bool{"west": true}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("zone west has nothing: %v", err)
	}
}

func TestParametersAndCapabilities(t *testing.T) {
	if _, err := parseParams(map[string]string{"pool": "tank", "level": "RAID6", "minRedundancy": "1", "csi.storage.k8s.io/fstype": "xfs"}); err != nil {
		t.Error(err)
	}
	for _, bad := range []map[string]string{{"level": "raid7"}, {"minRedundancy": "3"}, {"color": "blue"}} {
		if _, err := parseParams(bad); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	mount := func(mode csi.VolumeCapability_AccessMode_Mode, fs string) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fs}}}
	}
	if err := checkCapability(mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "ext4")); err != nil {
		t.Error(err)
	}
	if checkCapability(mount(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER, "")) == nil {
		t.Error("multi-node writers accepted")
	}
	if checkCapability(mount(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "btrfs")) == nil {
		t.Error("btrfs accepted")
	}
	if checkCapabilities(nil) == nil {
		t.Error("no capabilities accepted")
	}
}

func TestAPIErrorsBecomeCSICodes(t *testing.T) {
	for status_, want := range map[int]codes.Code{404: codes.NotFound, 409: codes.FailedPrecondition, 400: codes.InvalidArgument, 401: codes.Unauthenticated, 500: codes.Internal} {
		err := apiStatus(&millrace.APIError{Server: "s", Status: status_, Message: "m"}, "doing")
		if status.Code(err) != want {
			t.Errorf("HTTP %d became %v", status_, status.Code(err))
		}
	}
	err := apiStatus(&millrace.DownError{Server: "b:1", URL: "http://b:1", Err: io.EOF}, "doing")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "b:1") {
		t.Errorf("a server down: %v", err)
	}
}

// closedURL is an address nothing listens on: a server that is down.
func closedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}

func testDriver(t *testing.T, urls ...string) *Driver {
	var servers []ServerConfig
	for _, u := range urls {
		s, err := ParseServer(u)
		if err != nil {
			t.Fatal(err)
		}
		servers = append(servers, s)
	}
	d, err := New(Config{Controller: true, Servers: servers}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestRefusalsBeforeAnyServerIsAsked(t *testing.T) {
	d := testDriver(t, closedURL(t))
	ctx := context.Background()
	capab := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
	check := func(what string, err error, want codes.Code) {
		t.Helper()
		if status.Code(err) != want {
			t.Errorf("%s: got %v, want %v", what, err, want)
		}
	}
	_, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{capab}})
	check("create without a name", err, codes.InvalidArgument)
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v"})
	check("create without capabilities", err, codes.InvalidArgument)
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "reallyfakevolumeid"})
	check("delete of an id never made", err, codes.OK)
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "mr1/elsewhere:1/tank/v"})
	check("delete on a server not configured", err, codes.FailedPrecondition)
	_, err = d.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "mr1/x/tank/v", NodeId: "fake-node-id", VolumeCapability: capab})
	check("publish to a node id that is not an NQN", err, codes.NotFound)
	_, err = d.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "fake", NodeId: "n"})
	check("unpublish of an id never made", err, codes.OK)
	_, err = d.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "fake", VolumeCapabilities: []*csi.VolumeCapability{capab}})
	check("validate an id never made", err, codes.NotFound)
	_, err = d.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "x"})
	check("a token ListVolumes never gave", err, codes.Aborted)
}

func TestAServerDownIsUnavailableAndNamed(t *testing.T) {
	url := closedURL(t)
	d := testDriver(t, url+",name=gone")
	ctx := context.Background()
	capab := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}
	_, err := d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{capab}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "gone") {
		t.Errorf("create with the only server down: %v", err)
	}
	_, err = d.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "mr1/gone/tank/v"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "gone") {
		t.Errorf("delete on a server that is down: %v", err)
	}
	// A retry of a create that was placed on a server now down waits for it.
	d.reserve("w", VolumeID{Server: "gone", Pool: "tank", Volume: "w"})
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "w", VolumeCapabilities: []*csi.VolumeCapability{capab}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "rather than make a second volume") {
		t.Errorf("a reserved name on a server that is down: %v", err)
	}
	// Two calls for one name at once: the second is Aborted, to be retried.
	unlock, _ := d.locks.lock("name v")
	_, err = d.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{capab}})
	unlock()
	if status.Code(err) != codes.Aborted {
		t.Errorf("a create while one runs for the same name: %v", err)
	}
}

func TestServerFlags(t *testing.T) {
	s, err := ParseServer("http://10.0.0.5:8740,zone=a,name=s5")
	if err != nil || s.Zone != "a" || s.Name != "s5" || s.URL != "http://10.0.0.5:8740" {
		t.Errorf("%+v %v", s, err)
	}
	s, err = ParseServer("https://m1.example:8740")
	if err != nil || s.Zone != DefaultZone || s.Name != "m1.example:8740" {
		t.Errorf("%+v %v", s, err)
	}
	for _, bad := range []string{"10.0.0.5:8740", "http://x:1,zone=", "http://x:1,name=a/b", "http://x:1,color=red"} {
		if _, err := ParseServer(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if isNQN("fake-node-id-1") || !isNQN("nqn.2014-08.org.nvmexpress:uuid:1") || isNQN("nqn.a b") {
		t.Error("NQN rules")
	}
}
