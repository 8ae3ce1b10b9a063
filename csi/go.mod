module millrace.dev/csi

go 1.25.0

require (
	github.com/container-storage-interface/spec v1.13.0
	golang.org/x/sys v0.46.0
	google.golang.org/grpc v1.83.1
	google.golang.org/protobuf v1.36.12
	k8s.io/mount-utils v0.34.2
)

require (
	github.com/Masterminds/semver/v3 v3.4.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/pprof v0.0.0-20260402051712-545e8a4df936 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/kubernetes-csi/csi-test/v5 v5.6.0 // indirect
	github.com/moby/sys/mountinfo v0.7.2 // indirect
	github.com/onsi/ginkgo/v2 v2.32.1 // indirect
	github.com/onsi/gomega v1.42.1 // indirect
	go.uber.org/mock v0.6.0 // indirect
	go.yaml.in/yaml/v3 v3.0.4 // indirect
	golang.org/x/mod v0.36.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/text v0.38.0 // indirect
	golang.org/x/tools v0.45.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/utils v0.0.0-20250604170112-4c0f3b243397 // indirect
)

tool github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
