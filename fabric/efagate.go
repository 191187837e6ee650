package fabric

import (
	"fmt"
	"sync"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// AbortTrapError says that a libfabric call would abort() this process:
// a probe child that made the call was killed by SIGABRT. Fix says what to
// change.
type AbortTrapError struct {
	Call    string // "fi_getinfo", "fi_getinfo with FI_HMEM", "efa endpoint open (DOMAIN)"
	Library string // libfabric release, e.g. "1.17.0"
	Setting DeviceRDMASetting
	API     Version
	Message string // libfabric's last words on the child's stderr
}

func (e *AbortTrapError) Error() string {
	msg := fmt.Sprintf("libfabric %s would abort() this process in %s: a probe child making that call was killed by SIGABRT",
		e.Library, e.Call)
	if e.Message != "" {
		msg += fmt.Sprintf(" (libfabric: %q)", e.Message)
	}
	return msg + "; " + e.Setting.String() + "; fix: " + e.Fix()
}

// Fix is what to change so the call no longer aborts, from the setting
// and libfabric's reasons for abort() (efa_rdm_util.c@v2.1.0:35-70,
// rxr_env.c@v1.17.0:98-104).
func (e *AbortTrapError) Fix() string {
	s := e.Setting
	switch {
	case s.Set && !s.Valid:
		return "set " + EnvUseDeviceRDMA + " to one of 0/1/false/true/no/yes/off/on, or unset it"
	case s.Set && s.On:
		return "unset " + EnvUseDeviceRDMA + " (or set it to 0): the first EFA device has no RDMA read, and libfabric aborts when the variable asks for device RDMA there"
	case !e.API.AtLeast(1, 18):
		return "build against libfabric 1.18+ headers (API 1.18): below API 1.18 libfabric aborts on a device other than 0xefa0/0xefa1 that lacks RDMA read"
	}
	return "see libfabric's message; a libfabric.conf may set " + EnvUseDeviceRDMA
}

// ProbeError says that fitransfer could not find out safely whether a
// libfabric call would abort(), because its probe child did not answer.
type ProbeError struct {
	Call    string
	Setting DeviceRDMASetting
	Err     error
}

func (e *ProbeError) Error() string {
	return fmt.Sprintf("cannot tell whether %s would abort() this process (%s): %v; unset %s to skip the check",
		e.Call, e.Setting, e.Err, EnvUseDeviceRDMA)
}

func (e *ProbeError) Unwrap() error { return e.Err }

// gate holds what decides the EFA abort traps: the library, the setting
// and a way to run a probe child. Tests give it a fake probe.
type gate struct {
	library string
	runtime Version
	api     Version
	setting DeviceRDMASetting
	probe   func(probePlan) probeResult
	epProbe func() probeResult             // the endpoint probe; nil: run one with probe
	inproc  func(*Info) (DeviceRMA, error) // the endpoint probe made in this process
}

func currentGate() gate {
	rt := ofi.RuntimeVersion()
	return gate{
		library: ofi.LibraryVersion(),
		runtime: rt,
		api:     APIVersion(),
		setting: ReadDeviceRDMASetting(rt),
		probe:   runProbe,
		epProbe: func() probeResult { _, r := efaEndpointProbe(); return r },
		inproc:  probeEmulatedHere,
	}
}

func (g gate) trap(call string, r probeResult) error {
	switch {
	case r.Aborted:
		if r.Call != "" {
			call = r.Call
		}
		return &AbortTrapError{Call: call, Library: g.library, Setting: g.setting, API: g.api, Message: r.Message}
	case r.Err != nil:
		return &ProbeError{Call: call, Setting: g.setting, Err: r.Err}
	}
	return nil
}

// getInfoTrap decides whether fi_getinfo may be called. Only libfabric
// 1.17 aborts there: its efa provider init, which every fi_getinfo runs,
// reads FI_EFA_USE_DEVICE_RDMA as an integer and aborts when it is
// nonzero and the first EFA device lacks the RDMA-read capability bit
// (rxr_env.c@v1.17.0:98-104). Whether the bit is set only libfabric can
// say, so a child makes the call.
func (g gate) getInfoTrap() error {
	if g.runtime.AtLeast(1, 18) || !g.setting.On {
		return nil
	}
	return g.trap("fi_getinfo", g.probe(probePlan{api: g.api, steps: []string{stepGetInfo}}))
}

// hmemTrap decides whether fi_getinfo with FI_HMEM may be called on
// 1.18+. That path calls efa_rdm_get_use_device_rdma only after finding
// RDMA read on the device (efa_user_info.c@v2.1.0:156-164), so of its
// aborts only the one for a value fi_parse_bool rejects can fire
// (efa_rdm_util.c@v2.1.0:54-60); and not at all with CUDA present and API
// 1.18+ (efa_user_info.c@v2.1.0:113-121). A child makes the call.
func (g gate) hmemTrap() error {
	if !g.runtime.AtLeast(1, 18) || !g.setting.Set || g.setting.Valid {
		return nil
	}
	return g.trap("fi_getinfo with FI_HMEM", g.probe(probePlan{api: g.api, steps: []string{stepGetInfo, stepHMEM}}))
}

// endpointRisk reports whether opening an efa RDM endpoint may abort on
// 1.18+, from what this process can see: efa_rdm_get_use_device_rdma
// aborts only with the variable set, or with API < 1.18
// (efa_rdm_util.c@v2.1.0:35-70). A libfabric.conf can also set the
// variable (src/var.c@v2.1.0:366-369), which fitransfer does not read.
func (g gate) endpointRisk() bool {
	return g.setting.Set || !g.api.AtLeast(1, 18)
}

// endpointProbe asks a child to open an endpoint on every efa RDM domain
// (and, with API 1.18+ headers and library, to ask fi_getopt whether RMA
// is emulated). When the child cannot run and this process sees no risk,
// the caller may probe in process instead.
func (g gate) endpointProbe() probeResult {
	if g.epProbe != nil {
		return g.epProbe()
	}
	return g.probe(probePlan{api: g.api, steps: []string{stepGetInfo, stepEndpoints}})
}

// facts fills DeviceRMA for the efa RDM domains of infos and says whether
// efa RDM endpoints may be opened at all.
func (g gate) facts(infos []Info) Facts {
	facts := Facts{DeviceRMA: map[string]DeviceRMA{}}
	for i := range infos {
		in := &infos[i]
		if isEFADirect(in) && in.Caps.Has(RMACaps) {
			// efa-direct claims FI_RMA only with device read and write
			// (efa_prov_info.c@v2.1.0:474-479, @v2.4.0:474-484).
			facts.DeviceRMA[in.Domain.Name] = DeviceRMA{Read: Yes, Write: Yes}
		}
	}
	var rdm []*Info
	for i := range infos {
		if in := &infos[i]; isEFARDM(in) {
			if _, known := facts.DeviceRMA[in.Domain.Name]; !known {
				rdm = append(rdm, in)
			}
		}
	}
	if len(rdm) == 0 {
		return facts
	}
	if !g.runtime.AtLeast(1, 18) {
		// 1.17: opening an endpoint reads nothing that aborts; the
		// variable, read once at provider init, is the device-RDMA switch
		// (efa.h@v1.17.0:338-347), and 1.17 has no device RDMA write.
		r := DeviceRMA{Read: Unknown, Write: No}
		switch {
		case g.setting.On:
			// Provider init survived (getInfoTrap), so the first device has
			// RDMA read.
			r.Read = Yes
		case g.setting.Set:
			r.Read = No
		}
		for _, in := range rdm {
			facts.DeviceRMA[in.Domain.Name] = r
		}
		return facts
	}
	res := g.endpointProbe()
	if res.Err != nil && !g.endpointRisk() && g.inproc != nil {
		for _, in := range rdm {
			if r, err := g.inproc(in); err == nil {
				facts.DeviceRMA[in.Domain.Name] = r
			}
		}
		return facts
	}
	if err := g.trap("efa endpoint open", res); err != nil {
		facts.EFAEndpoint = err
		return facts
	}
	for _, in := range rdm {
		r, ok := res.RMA[in.Domain.Name]
		if !ok {
			continue
		}
		if r.Read == Unknown && g.setting.Set && g.setting.Valid {
			// Without fi_getopt: the variable, when libfabric accepts it,
			// is the endpoint's use_device_rdma; off means both emulated
			// (efa_rdm_ep.h@v2.1.0:320-345). On, and the child survived the
			// open, the first device has RDMA read (efa_rdm_util.c@v2.1.0:65-70).
			if g.setting.On {
				r.Read = Yes
			} else {
				r = DeviceRMA{Read: No, Write: No}
			}
		}
		facts.DeviceRMA[in.Domain.Name] = r
	}
	return facts
}

// The process-wide answers: each probe child runs at most once per
// process.
var (
	getInfoOnce sync.Once
	getInfoErr  error
	hmemOnce    sync.Once
	hmemErr     error
	epOnce      sync.Once
	epResult    probeResult
	epGate      gate
)

// EFAGetInfoGate reports (once per process) whether fi_getinfo would
// abort() the process: with libfabric 1.17 and FI_EFA_USE_DEVICE_RDMA
// nonzero as strtol reads it, a probe child makes the call first. It
// returns an *AbortTrapError (with the fix) when the child aborted, a
// *ProbeError when it could not tell, and nil otherwise — always nil on
// libfabric 1.18+, where fi_getinfo aborts only on the FI_HMEM path
// (GetInfo checks that one itself).
func EFAGetInfoGate() error {
	getInfoOnce.Do(func() { getInfoErr = currentGate().getInfoTrap() })
	return getInfoErr
}

func efaHMEMGate() error {
	hmemOnce.Do(func() { hmemErr = currentGate().hmemTrap() })
	return hmemErr
}

// efaEndpointProbe runs the endpoint probe child once per process.
func efaEndpointProbe() (gate, probeResult) {
	epOnce.Do(func() {
		epGate = currentGate()
		epGate.epProbe = nil
		epResult = epGate.endpointProbe()
	})
	return epGate, epResult
}

// EFAEndpointGate reports (once per process) whether opening an endpoint
// of the efa RDM fabric would abort() the process. Only libfabric 1.18+
// reads FI_EFA_USE_DEVICE_RDMA there (efa_rdm_ep_fiops.c@v2.1.0:503); a
// probe child opens one first. nil means it is safe.
func EFAEndpointGate() error {
	g := currentGate()
	if !g.runtime.AtLeast(1, 18) {
		return nil
	}
	g, r := efaEndpointProbe()
	if r.Err != nil && !g.endpointRisk() {
		return nil
	}
	return g.trap("efa endpoint open", r)
}

// guardEFAEndpoint is internal/ofi's hook before an efa RDM endpoint open.
func guardEFAEndpoint(domain string) error {
	if err := EFAEndpointGate(); err != nil {
		return fmt.Errorf("not opening an efa endpoint on %s: %w", domain, err)
	}
	return nil
}

// probeEmulatedHere asks fi_getopt in this process; used only where no
// abort is possible (see gate.facts).
func probeEmulatedHere(in *Info) (DeviceRMA, error) {
	if !ofi.CompiledVersion().AtLeast(1, 18) || !APIVersion().AtLeast(1, 18) {
		return DeviceRMA{}, errNotProbed
	}
	f, err := OpenFabric(in)
	if err != nil {
		return DeviceRMA{}, err
	}
	defer f.Close()
	d, err := f.OpenDomain(in)
	if err != nil {
		return DeviceRMA{}, err
	}
	defer d.Close()
	emuRead, emuWrite, err := d.ProbeEFAEmulated()
	if err != nil {
		return DeviceRMA{}, err
	}
	return DeviceRMA{Read: tristateOf(!emuRead), Write: tristateOf(!emuWrite)}, nil
}

func tristateOf(b bool) Tristate {
	if b {
		return Yes
	}
	return No
}
