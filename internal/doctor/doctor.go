// Package doctor checks whether fitransfer transfers can work on this
// machine and, for each problem, says how to fix it. `fitransfer doctor`
// prints its Report.
package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/transport"
)

// Status is a check's outcome.
type Status string

// Check outcomes.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Check is one line of the report.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	Fix    string `json:"fix,omitempty"` // set for warn and fail
}

// Route is the backend a transfer to a peer would use.
type Route struct {
	Locality string `json:"locality"`
	Backend  string `json:"backend,omitempty"`
	Reason   string `json:"reason"`
}

// Report is everything doctor found. OK is false when no transfer could
// work (the command then exits non-zero).
type Report struct {
	Libfabric fabric.Versions    `json:"libfabric"`
	Headers   fabric.HeadersHave `json:"headers"`
	Checks    []Check            `json:"checks"`
	Routes    []Route            `json:"routes"`
	EFA       []fabric.EFADevice `json:"efa_devices"`
	Rails     *Rails             `json:"rails,omitempty"`
	OK        bool               `json:"ok"`
	Verdict   string             `json:"verdict"`
}

// Options point the checks at this machine; tests override them.
type Options struct {
	SysfsRoot string // default /sys
	ShmDir    string // default /dev/shm
	Exe       string // the binary to start as CMA probe target; default os.Executable
	Policy    fabric.RMAPolicy
	Ctx       context.Context // bounds the CMA probe; default Background
}

// minShmFree is the /dev/shm room below which doctor warns: the shm
// provider maps a region per endpoint, and Docker's 64 MiB default is a
// known cause of failures.
const minShmFree = 256 << 20

// Run performs every check.
func Run(o Options) Report {
	if o.SysfsRoot == "" {
		o.SysfsRoot = fabric.SysfsRoot
	}
	if o.ShmDir == "" {
		o.ShmDir = "/dev/shm"
	}
	if o.Ctx == nil {
		o.Ctx = context.Background()
	}
	if o.Exe == "" {
		o.Exe, _ = os.Executable()
	}
	r := Report{Libfabric: fabric.CurrentVersions(), Headers: fabric.CompiledFeatures()}
	add := func(c Check) { r.Checks = append(r.Checks, c) }

	add(checkVersion(r.Libfabric, r.Headers))

	devs, err := fabric.EFADevices(o.SysfsRoot)
	r.EFA = devs
	trap := checkAbortTrap(fabric.RuntimeVersion(), fabric.EFAGetInfoGate())
	add(trap)
	if trap.Status == Fail {
		// fi_getinfo would abort this process (libfabric 1.17 reads the
		// variable in the efa provider's init): stop before calling it.
		r.Verdict = "no transfer can work until " + fabric.EnvUseDeviceRDMA + " is changed: " + trap.Fix
		return r
	}

	provs, perr := fabric.GetInfo(fabric.Query{ProvidersOnly: true})
	add(checkProviders(provs, perr))

	infos, ierr := fabric.GetInfo(fabric.Query{Hints: fabric.RMAHints("")})
	if ierr != nil && !errors.Is(ierr, fabric.ErrNoData) {
		add(Check{Name: "rma-providers", Status: Fail, Detail: ierr.Error(), Fix: "check the libfabric installation (`fi_info`)"})
	}
	facts := fabric.ProbeDeviceRMA(infos)
	add(checkEFA(devs, err, infos, facts))
	add(checkShmSpace(o.ShmDir))
	add(checkCMA(o.Ctx, o.Exe))
	add(checkMemlock(len(devs) > 0))
	add(checkFIEnv())
	add(checkDeviceMemory(infos))

	sameNode := route(infos, fabric.SameNode, o.Policy, facts)
	if ok, _ := transport.CMAAvailable(); ok && sameNode.Backend != "" {
		// What transport does on libfabric 1.x (internal/route/cma).
		sameNode.Reason = "process_vm_readv/writev by fitransfer: libfabric's shm can leave a process deaf for good when a peer dies mid-copy; " +
			"shm when CMA does not reach a peer (" + sameNode.Reason + ")"
		sameNode.Backend = "cma"
	}
	if ok, _ := transport.MemAvailable(); ok && sameNode.Backend != "" {
		// What transport does first toward a verified owner (the mem route).
		sameNode.Reason = "a verified process of this user maps the owner's mr.Alloc memory and copies, no syscall per op; " +
			"for memory it does not share, " + sameNode.Backend + ": " + sameNode.Reason
		sameNode.Backend = "mem"
	}
	remote := route(infos, fabric.Remote, o.Policy, facts)
	r.Routes = []Route{sameNode, remote}
	for _, rt := range r.Routes {
		c := Check{Name: "backend-" + strings.ReplaceAll(rt.Locality, " ", "-"), Status: Pass, Detail: rt.Reason}
		if rt.Backend == "" {
			c.Status, c.Fix = Fail, "install a libfabric with the shm and tcp providers (Debian: libfabric1), or run on an EFA instance"
		} else {
			c.Detail = rt.Backend + " — " + rt.Reason
		}
		add(c)
	}
	r.Rails = railsFor(infos, o.Policy, facts, o.SysfsRoot)
	rails := r.Rails.check()
	add(rails)
	open := checkManagerOpens(o.Ctx, rails.Status != Fail && (sameNode.Backend != "" || remote.Backend != ""))
	add(open)
	r.OK = (sameNode.Backend != "" || remote.Backend != "") && rails.Status != Fail && open.Status != Fail
	switch {
	case rails.Status == Fail:
		r.Verdict = "no transfer can work: a Manager does not open (" + rails.Detail + ")"
	case open.Status == Fail:
		r.Verdict = "no transfer can work: a Manager does not open (" + open.Detail + ")"
	case sameNode.Backend != "" && remote.Backend != "":
		r.Verdict = fmt.Sprintf("transfers can work: same node over %s, remote over %s", sameNode.Backend, remote.Backend)
	case r.OK:
		r.Verdict = "transfers can work only partly: see the failed backend line"
	default:
		r.Verdict = "no transfer can work on this machine: see the failed lines"
	}
	return r
}

// checkManagerOpens opens a Manager with default options, and closes
// it, when the checks before found backends to open (try): the providers
// libfabric lists may still fail to open (FI_HOOK=debug refused every
// completion queue, 1.17 and 2.1, while the listing looked fine).
func checkManagerOpens(ctx context.Context, try bool) Check {
	c := Check{Name: "manager-open", Status: Pass}
	if !try {
		c.Detail = "not tried: no backend to open (see above)"
		return c
	}
	m, err := transport.New(ctx)
	if err != nil {
		c.Status, c.Detail = Fail, err.Error()
		c.Fix = "a provider libfabric lists does not open here: check the FI_* variables that change providers (FI_HOOK, FI_PROVIDER; `fitransfer info --env`), or force one that opens with -p"
		return c
	}
	var names []string
	for _, b := range m.Backends() {
		names = append(names, b.Provider)
	}
	c.Detail = "a Manager with default options opens " + strings.Join(names, ", ")
	if err := m.Close(); err != nil {
		c.Status, c.Detail, c.Fix = Warn, c.Detail+", and closing it failed: "+err.Error(), "see docs/RELIABILITY.md"
	}
	return c
}

func route(infos []fabric.Info, loc fabric.Locality, p fabric.RMAPolicy, facts fabric.Facts) Route {
	c, err := fabric.Select(infos, loc, p, facts)
	if err != nil {
		return Route{Locality: loc.String(), Reason: err.Error()}
	}
	return Route{Locality: loc.String(), Backend: string(c.Backend), Reason: c.Reason}
}

func checkVersion(v fabric.Versions, h fabric.HeadersHave) Check {
	c := Check{Name: "libfabric", Status: Pass,
		Detail: fmt.Sprintf("%s (API %s: compiled %s, runtime %s; optional features compiled in: %s)",
			v.Library, v.API, v.Compiled, v.Runtime, h)}
	if !v.API.AtLeast(1, 18) {
		c.Status = Warn
		c.Fix = "API " + v.API.String() + " < 1.18: efa cannot report emulated RMA and keeps device RDMA off on P4d-class parts; " +
			"build against libfabric 1.18+ (AWS EFA installer: PKG_CONFIG_PATH=/opt/amazon/efa/lib/pkgconfig make build)"
	}
	return c
}

// checkAbortTrap reports FI_EFA_USE_DEVICE_RDMA as this libfabric reads
// it, and whether fi_getinfo would abort() (gateErr, from
// fabric.EFAGetInfoGate: a probe child made the call).
func checkAbortTrap(rt fabric.Version, gateErr error) Check {
	s := fabric.ReadDeviceRDMASetting(rt)
	c := Check{Name: "efa-use-device-rdma", Status: Pass, Detail: s.String()}
	var trap *fabric.AbortTrapError
	switch {
	case errors.As(gateErr, &trap):
		c.Status, c.Detail, c.Fix = Fail, gateErr.Error(), trap.Fix()
	case gateErr != nil:
		c.Status, c.Detail = Fail, gateErr.Error()
		c.Fix = "unset " + fabric.EnvUseDeviceRDMA + ", or run where the probe child can start (it re-runs this binary)"
	case s.Set && s.Integer && !s.On && s.Raw != "0":
		// strtol reads "true" or "yes" as 0 (src/var.c@v1.17.0:290-291).
		c.Status = Warn
		c.Fix = "libfabric 1.17 takes this variable as a number: 1 turns device RDMA on, 0 off"
	case s.Set && !s.Integer && !s.Valid:
		// efa_rdm_get_use_device_rdma aborts on such a value
		// (efa_rdm_util.c@v2.1.0:54-60): efa endpoints are not opened.
		c.Status = Warn
		c.Detail += "; on an EFA device, opening an efa endpoint aborts with such a value, so fitransfer's probe child finds that out and the efa fabric is not used"
		c.Fix = "set " + fabric.EnvUseDeviceRDMA + " to one of 0/1/false/true/no/yes/off/on, or unset it"
	}
	return c
}

func checkProviders(provs []fabric.Info, err error) Check {
	if err != nil {
		return Check{Name: "providers", Status: Fail, Detail: err.Error(),
			Fix: "install libfabric's providers (Debian: apt-get install libfabric1 libfabric-bin)"}
	}
	var names []string
	for _, p := range fabric.ProvidersOf(provs) {
		names = append(names, p.Name)
	}
	return Check{Name: "providers", Status: Pass, Detail: strings.Join(names, ", ")}
}

func checkEFA(devs []fabric.EFADevice, sysErr error, infos []fabric.Info, facts fabric.Facts) Check {
	c := Check{Name: "efa", Status: Pass}
	if sysErr != nil {
		c.Status, c.Detail, c.Fix = Warn, "cannot read sysfs: "+sysErr.Error(), "run where /sys/class/infiniband is visible"
		return c
	}
	efaInfos := 0
	for _, in := range infos {
		if in.Fabric.ProvName == "efa" {
			efaInfos++
		}
	}
	if len(devs) == 0 {
		c.Detail = "no EFA device (sysfs); the efa provider is not used here"
		if efaInfos > 0 {
			c.Detail = "the efa provider answered but sysfs shows no EFA device"
		}
		return c
	}
	if facts.EFAEndpoint != nil {
		c.Status, c.Detail = Fail, facts.EFAEndpoint.Error()
		c.Fix = "unset " + fabric.EnvUseDeviceRDMA
		var trap *fabric.AbortTrapError
		if errors.As(facts.EFAEndpoint, &trap) {
			c.Fix = trap.Fix()
		}
		return c
	}
	var parts []string
	for _, d := range devs {
		rma := facts.DeviceRMA[d.Name+"-rdm"]
		parts = append(parts, fmt.Sprintf("%s (%s): RDMA read %s, write %s", d.Name, d.PCIDevice, rmaWord(rma.Read), rmaWord(rma.Write)))
		if rma.Read != fabric.Yes || rma.Write != fabric.Yes {
			c.Status = Warn
		}
	}
	c.Detail = strings.Join(parts, "; ")
	if efaInfos == 0 {
		c.Status, c.Fix = Fail, "EFA device present but libfabric's efa provider did not answer: "+
			"in a container, pass /dev/infiniband through; check that this libfabric has efa (`fi_info -p efa`) and that the EFA kernel driver is loaded"
		return c
	}
	if c.Status == Warn {
		c.Fix = "RMA that is not on the device is emulated by the efa provider (needs the target to progress) " +
			"and used only with --allow-emulated; otherwise fitransfer falls back to tcp;ofi_rxm"
	}
	return c
}

func rmaWord(t fabric.Tristate) string {
	switch t {
	case fabric.Yes:
		return "on device"
	case fabric.No:
		return "emulated"
	}
	return "unknown (needs libfabric API 1.18+)"
}

func checkShmSpace(dir string) Check {
	c := Check{Name: "shm-space", Status: Pass}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		c.Status, c.Detail = Fail, dir+": "+err.Error()
		c.Fix = "mount a tmpfs on " + dir + " (containers: docker run --shm-size=1g)"
		return c
	}
	f, err := os.CreateTemp(dir, "fitransfer-doctor-*")
	if err != nil {
		c.Status, c.Detail = Fail, dir+" not writable: "+err.Error()
		c.Fix = "make " + dir + " writable by this user (mode 1777)"
		return c
	}
	f.Close()
	os.Remove(f.Name())
	free := st.Bavail * uint64(st.Bsize)
	c.Detail = fmt.Sprintf("%s: %s free", dir, mib(free))
	if free < minShmFree {
		c.Status = Warn
		c.Fix = fmt.Sprintf("shm maps a region per endpoint and fails when %s is full; give it ≥ %s (docker run --shm-size=1g)", dir, mib(minShmFree))
	}
	return c
}

func checkCMA(ctx context.Context, exe string) Check {
	c := Check{Name: "shm-cma", Status: Pass}
	scope := strings.TrimSpace(readFile("/proc/sys/kernel/yama/ptrace_scope"))
	err := probeCMA(ctx, exe)
	switch {
	case err != nil:
		c.Status, c.Detail = Warn, "process_vm_writev into a child process failed: "+err.Error()
		c.Fix = "same-node transfers then go over libfabric's shm (slower, needs the target to progress); allow ptrace between the processes " +
			"(echo 0 > /proc/sys/kernel/yama/ptrace_scope, or CAP_SYS_PTRACE; docker: --cap-add SYS_PTRACE)"
	case scope == "1":
		c.Status, c.Detail = Warn, "process_vm_writev works to a child, but yama ptrace_scope=1 blocks it between unrelated processes"
		c.Fix = "for fitransfer's cma route (and 1.x shm's single copy) between unrelated processes: echo 0 > /proc/sys/kernel/yama/ptrace_scope, or give CAP_SYS_PTRACE"
	case scope == "2" || scope == "3":
		c.Status, c.Detail = Warn, "yama ptrace_scope="+scope+": CMA needs CAP_SYS_PTRACE"
		c.Fix = "run with CAP_SYS_PTRACE, or lower /proc/sys/kernel/yama/ptrace_scope"
	default:
		c.Detail = "process_vm_writev into another process works (fitransfer's cma route; 1.x shm's single-copy RMA)"
		if scope != "" {
			c.Detail += "; yama ptrace_scope=" + scope
		}
	}
	return c
}

func checkMemlock(haveEFA bool) Check {
	c := Check{Name: "memlock", Status: Pass}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err != nil {
		c.Status, c.Detail, c.Fix = Warn, err.Error(), "check ulimit -l"
		return c
	}
	if rl.Cur == unix.RLIM_INFINITY {
		c.Detail = "unlimited"
		return c
	}
	c.Detail = mib(rl.Cur)
	if haveEFA {
		c.Status = Warn
		c.Fix = "EFA pins registered memory: raise it (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; docker --ulimit memlock=-1)"
	} else {
		c.Detail += " (shm and tcp do not pin memory)"
	}
	return c
}

func checkFIEnv() Check {
	var vars []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FI_") {
			vars = append(vars, kv)
		}
	}
	sort.Strings(vars)
	c := Check{Name: "fi-env", Status: Pass, Detail: "no FI_* variables set"}
	if len(vars) > 0 {
		c.Detail = strings.Join(vars, " ")
	}
	for _, kv := range vars {
		if strings.HasPrefix(kv, "FI_PROVIDER=") {
			c.Status = Warn
			c.Fix = "FI_PROVIDER limits which providers load; unset it unless that is intended"
		}
	}
	return c
}

func readFile(path string) string {
	b, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return ""
	}
	return string(b)
}

func mib(n uint64) string { return fmt.Sprintf("%d MiB", n>>20) }

// checkDeviceMemory says whether device memory (FI_HMEM) can be
// registered here, and — where the headers have FI_OPT_CUDA_API_PERMITTED
// (1.18+) — whether libfabric's CUDA support is up: asking an endpoint for
// CUDA calls is refused (-FI_EINVAL) when libfabric found no CUDA library
// or device. Host memory transfers do not need either, so this never fails.
func checkDeviceMemory(infos []fabric.Info) Check {
	c := Check{Name: "device-memory", Status: Pass}
	var hmem []string
	if his, err := fabric.GetInfo(fabric.Query{Hints: fabric.WithHMEM(fabric.RMAHints(""))}); err == nil {
		for _, p := range fabric.ProvidersOf(his) {
			hmem = append(hmem, p.Name)
		}
	}
	if len(hmem) == 0 {
		c.Detail = "no provider registers device memory here (FI_HMEM with FI_MR_HMEM): host memory only"
	} else {
		c.Detail = "FI_HMEM from " + strings.Join(hmem, ", ")
	}
	return withCUDAProbe(c, infos)
}

func withCUDAProbe(c Check, infos []fabric.Info) Check {
	var info *fabric.Info
	for i := range infos {
		if p := infos[i].Fabric.ProvName; p == "shm" || (info == nil && p == string(fabric.BackendTCP)) {
			info = &infos[i]
		}
	}
	if info == nil {
		return c
	}
	err := probeCUDAAPI(info)
	switch {
	case err == nil:
		c.Detail += "; libfabric's CUDA support is up (" + info.Fabric.ProvName + " accepts FI_OPT_CUDA_API_PERMITTED)"
	case errors.Is(err, fabric.ErrNoSys):
		c.Detail += "; FI_OPT_CUDA_API_PERMITTED not compiled in (headers older than 1.18)"
	case errors.Is(err, fabric.ErrInval):
		c.Detail += "; libfabric found no CUDA library or device (" + info.Fabric.ProvName + " refuses FI_OPT_CUDA_API_PERMITTED with -FI_EINVAL)"
	default:
		c.Detail += "; " + info.Fabric.ProvName + ": " + err.Error()
	}
	return c
}

// probeCUDAAPI opens an endpoint of info asking FI_OPT_CUDA_API_PERMITTED
// true and returns fi_setopt's answer.
func probeCUDAAPI(info *fabric.Info) error {
	f, err := fabric.OpenFabric(info)
	if err != nil {
		return err
	}
	defer f.Close()
	d, err := f.OpenDomain(info)
	if err != nil {
		return err
	}
	defer d.Close()
	yes := true
	ep, err := d.OpenEndpoint(0, false, fabric.EndpointOptions{CUDAAPIPermitted: &yes})
	if err != nil {
		return err
	}
	defer ep.Close()
	return ep.Options().CUDAAPIPermitted
}
