#!/usr/bin/env bash
# The CSI driver's own checks: gofmt, go vet, the build the README names, the Go tests (ids,
# placement, parameters, error codes, the sysfs lookups, the stock filesystem tools), and the
# manifests under csi/deploy: Kubernetes' JSON schemas in strict mode (kubernetes-validate, from
# PyPI: unknown fields and wrong types are errors) and the names they must agree on.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root/csi"
bad=$(gofmt -l .)
[[ -z $bad ]] || { echo "gofmt would change: $bad" >&2; exit 1; }
go vet ./...
go build -o /dev/null ./cmd/millrace-csi
go test -count=1 ./...
command -v kubernetes-validate >/dev/null || python3 -m pip install -q --root-user-action=ignore kubernetes-validate
kubernetes-validate --strict --quiet -k 1.34.0 deploy/*.yaml
python3 - deploy <<'PY'
import glob, sys, yaml
docs = [d for f in sorted(glob.glob(sys.argv[1] + "/*.yaml")) for d in yaml.safe_load_all(open(f)) if d]
kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
name = "csi.millrace.dev"
assert ("CSIDriver", name) in kinds, "no CSIDriver named " + name
assert kinds[("CSIDriver", name)]["spec"]["attachRequired"] is True, "attach must go through ControllerPublish"
sc = [d for d in docs if d["kind"] == "StorageClass"]
assert sc and all(d["provisioner"] == name for d in sc), "a StorageClass names another provisioner"
accounts = {d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"}
for d in docs:
    if d["kind"] in ("Deployment", "DaemonSet"):
        spec = d["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] in accounts, d["metadata"]["name"] + ": unknown service account"
        images = [c["image"] for c in spec["containers"]]
        args = " ".join(a for c in spec["containers"] for a in c.get("args", []))
        assert "--endpoint=unix:///csi/csi.sock" in args and "--csi-address=/csi/csi.sock" in args, "socket paths disagree"
        if d["kind"] == "Deployment":
            for sidecar in ("csi-provisioner", "csi-attacher", "csi-resizer"):
                assert any(sidecar in i for i in images), "the controller lacks " + sidecar
            assert "--mode=controller" in args and "--server=" in args
        else:
            assert any("csi-node-driver-registrar" in i for i in images), "the node lacks the registrar"
            assert "plugins/" + name + "/csi.sock" in args, "the registrar registers another path"
            assert "--mode=node" in args
for d in docs:
    for s in d.get("subjects", []):
        assert s["name"] in accounts, "a binding names an unknown service account: " + s["name"]
print("csi/deploy: %d objects agree with each other" % len(docs))
PY
