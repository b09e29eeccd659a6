// Command spyre-dra-driver stands in for IBM's Spyre DRA driver (spyre.ibm.com) on the test
// node: a real kubelet plugin built on Kubernetes' own helper library
// (k8s.io/dynamic-resource-allocation/kubeletplugin). It registers with the kubelet through
// the kubelet's plugin registry, publishes the node's ResourceSlice (stand-in Spyre devices
// with the attributes IBM's DeviceClasses select on: pciFunctionIndex, vfEnabled), and
// answers the kubelet's NodePrepareResources / NodeUnprepareResources: a CDI spec per claim
// (the devices' environment, as IBM's driver gives AIU_DEVICE_<i>), removed again on
// unprepare. It keeps no state in memory that it cannot rebuild: the CDI files are the record
// of what is prepared (the kubelet may call Unprepare on a restarted driver).
//
// Each prepare and unprepare is appended to --record as one JSON line, for the tests.
// Built by tests/cluster/dra-deps.sh; started by tests/cluster/dradriver.py.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
)

const cdiKind = "spyre.ibm.com/aiu"

type driver struct {
	name    string
	node    string
	cdiDir  string
	record  string
	devices map[string]int // device name -> pciFunctionIndex
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
}

// cdiSpec is the part of the CDI spec format (cdi-spec 0.6.0) this driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name  string   `json:"name"`
	Edits cdiEdits `json:"containerEdits"`
}

type cdiEdits struct {
	Env []string `json:"env"`
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s.json", strings.ReplaceAll(d.name, "/", "_"), uid))
}

func (d *driver) write(rec map[string]any) {
	line, _ := json.Marshal(rec)
	f, err := os.OpenFile(d.record, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		klog.ErrorS(err, "record")
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
}

// inUse maps each device to the claim UID whose CDI spec holds it (the files are the record).
func (d *driver) inUse() (map[string]types.UID, error) {
	out := map[string]types.UID{}
	files, err := filepath.Glob(filepath.Join(d.cdiDir, strings.ReplaceAll(d.name, "/", "_")+"-*.json"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var spec cdiSpec
		if err := json.Unmarshal(data, &spec); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		uid := types.UID(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), strings.ReplaceAll(d.name, "/", "_")+"-"), ".json"))
		for _, dev := range spec.Devices {
			out[strings.TrimPrefix(dev.Name, string(uid)+"-")] = uid
		}
	}
	return out, nil
}

func (d *driver) prepareOne(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	if claim.Status.Allocation == nil {
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)}
	}
	used, err := d.inUse()
	if err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	spec := cdiSpec{Version: "0.6.0", Kind: cdiKind}
	var out []kubeletplugin.Device
	var names []string
	for i, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.name {
			continue
		}
		if _, ok := d.devices[r.Device]; !ok || r.Pool != d.node {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s/%s is not one of this node's", r.Pool, r.Device)}
		}
		if owner, ok := used[r.Device]; ok && owner != claim.UID {
			return kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s is already prepared for claim %s", r.Device, owner)}
		}
		cdiName := fmt.Sprintf("%s-%s", claim.UID, r.Device)
		spec.Devices = append(spec.Devices, cdiDevice{Name: cdiName, Edits: cdiEdits{Env: []string{
			fmt.Sprintf("AIU_DEVICE_%d=%s", i, r.Device),
			fmt.Sprintf("AIU_PCI_FUNCTION_INDEX_%d=%d", i, d.devices[r.Device]),
		}}})
		out = append(out, kubeletplugin.Device{
			Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
			CDIDeviceIDs: []string{cdiKind + "=" + cdiName},
		})
		names = append(names, r.Device)
	}
	data, _ := json.MarshalIndent(spec, "", " ")
	tmp := d.specPath(claim.UID) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if err := os.Rename(tmp, d.specPath(claim.UID)); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	d.write(map[string]any{"op": "prepare", "uid": claim.UID, "namespace": claim.Namespace,
		"name": claim.Name, "devices": names})
	return kubeletplugin.PrepareResult{Devices: out}
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = d.prepareOne(c)
	}
	return out, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		err := os.Remove(d.specPath(c.UID))
		if errors.Is(err, os.ErrNotExist) {
			err = nil // idempotent: not prepared (any more) is done
		}
		out[c.UID] = err
		d.write(map[string]any{"op": "unprepare", "uid": c.UID, "namespace": c.Namespace, "name": c.Name})
	}
	return out, nil
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("%s: %w", msg, err))
	}
}

// parseDevices reads "name=pciFunctionIndex,..." (device names as IBM's driver gives them).
func parseDevices(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, item := range strings.Split(s, ",") {
		name, idx, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("--devices: %q is not name=pciFunctionIndex", item)
		}
		n, err := strconv.Atoi(idx)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("--devices: %q: index must be a number >= 0", item)
		}
		out[name] = n
	}
	return out, nil
}

func main() {
	klog.InitFlags(nil)
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the driver's ServiceAccount")
	node := flag.String("node-name", "", "the node this plugin runs on")
	kubeletDir := flag.String("kubelet-dir", "/var/lib/kubelet", "the kubelet's --root-dir")
	cdiDir := flag.String("cdi-dir", "/var/run/cdi", "where the CDI specs go")
	record := flag.String("record", "", "append each prepare and unprepare here (JSON lines)")
	devices := flag.String("devices", "", "name=pciFunctionIndex,... (the node's devices)")
	name := flag.String("driver-name", "spyre.ibm.com", "the DRA driver name")
	flag.Parse()
	if *node == "" || *devices == "" || *record == "" {
		fmt.Fprintln(os.Stderr, "--node-name, --devices and --record are required")
		os.Exit(2)
	}
	devs, err := parseDevices(*devices)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		klog.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sigs; cancel(errors.New("signal")) }()

	dataDir := filepath.Join(*kubeletDir, "plugins", *name)
	regDir := filepath.Join(*kubeletDir, "plugins_registry")
	for _, dir := range []string{dataDir, regDir, *cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			klog.Fatal(err)
		}
	}
	d := &driver{name: *name, node: *node, cdiDir: *cdiDir, record: *record, devices: devs, cancel: cancel}
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.DriverName(*name),
		kubeletplugin.NodeName(*node),
		kubeletplugin.RegistrarDirectoryPath(regDir),
		kubeletplugin.PluginDataDirectoryPath(dataDir),
	)
	if err != nil {
		klog.Fatal(err)
	}
	names := make([]string, 0, len(devs))
	for n := range devs {
		names = append(names, n)
	}
	sort.Strings(names)
	var slice []resourceapi.Device
	for _, n := range names {
		idx, vf := int64(devs[n]), true
		slice = append(slice, resourceapi.Device{Name: n, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"pciFunctionIndex": {IntValue: &idx},
			"vfEnabled":        {BoolValue: &vf},
		}})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		*node: {Slices: []resourceslice.Slice{{Devices: slice}}},
	}}); err != nil {
		klog.Fatal(err)
	}
	klog.InfoS("serving", "driver", *name, "node", *node, "devices", names)
	<-ctx.Done()
	helper.Stop()
	klog.InfoS("stopped", "cause", context.Cause(ctx))
}
