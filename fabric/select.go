package fabric

import (
	"fmt"
	"strings"
)

// Locality is where the peer that owns the remote memory runs.
type Locality int

const (
	// SameProcess: the peer is this process (same manager): a plain copy.
	SameProcess Locality = iota
	// SameNode: another process on this host.
	SameNode
	// Remote: another host.
	Remote
)

func (l Locality) String() string {
	switch l {
	case SameProcess:
		return "same process"
	case SameNode:
		return "same node"
	case Remote:
		return "remote"
	}
	return fmt.Sprintf("Locality(%d)", int(l))
}

// RMAPolicy says whether fitransfer may use an EFA endpoint whose RMA is
// emulated by the provider's packet protocols instead of done by the device.
type RMAPolicy int

const (
	// RequireDeviceRMA uses EFA only when the device does RDMA read and
	// write; otherwise it falls back to tcp;ofi_rxm and says why. Default.
	RequireDeviceRMA RMAPolicy = iota
	// AllowEmulatedRMA also uses EFA when the provider emulates read or
	// write (P4d-class devices have no RDMA write). Emulated ops need the
	// target process to progress its endpoint.
	AllowEmulatedRMA
)

func (p RMAPolicy) String() string {
	if p == AllowEmulatedRMA {
		return "allow-emulated"
	}
	return "require-device"
}

// Backend names a transport fitransfer can route a transfer over.
type Backend string

// The backends, in the order Select prefers them for a remote peer (memcpy
// and shm serve same-process and same-node peers).
const (
	BackendMemcpy    Backend = "memcpy"
	BackendEFADirect Backend = "efa-direct"
	BackendEFA       Backend = "efa"
	BackendSHM       Backend = "shm"
	BackendTCP       Backend = "tcp;ofi_rxm"
)

// Tristate is a fact that may be unknown.
type Tristate int

const (
	// Unknown: nothing could tell.
	Unknown Tristate = iota
	// Yes: known to hold.
	Yes
	// No: known not to hold.
	No
)

func (t Tristate) String() string {
	switch t {
	case Yes:
		return "yes"
	case No:
		return "no"
	}
	return "unknown"
}

// DeviceRMA is whether RMA read and write on an endpoint of an EFA domain
// run on the device (Yes) or are emulated by the provider (No). It
// describes the endpoint, whose use_device_rdma may be off on hardware
// that has RDMA (efa_rdm_ep.h@v2.1.0:320-345), not the hardware alone. It
// comes from fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE) on API 1.18+, from
// the efa-direct fabric's FI_RMA on 2.1+, or from libfabric 1.17's
// setting (see ProbeDeviceRMA).
type DeviceRMA struct {
	Read  Tristate `json:"read"`
	Write Tristate `json:"write"`
}

// Facts are what Select knows beyond the infos: per EFA domain name, where
// RMA runs (see ProbeDeviceRMA), and whether opening an endpoint of the efa
// fabric would abort() the process.
type Facts struct {
	DeviceRMA map[string]DeviceRMA
	// EFAEndpoint, when set, says why endpoints of the efa fabric must not
	// be opened: an *AbortTrapError (a probe child aborted) or a
	// *ProbeError (it could not tell). Select then passes over efa.
	EFAEndpoint error
}

// Choice is the backend Select picked, the fi_info to open it with, and why.
type Choice struct {
	Backend Backend
	Info    *Info    // nil for memcpy
	Reason  string   // one line, for logs and `fitransfer doctor`
	Skipped []string // one line per better backend that was passed over, and why
	// Emulated lists the RMA ops the provider emulates on this backend
	// ("read", "write"); empty when the device does them.
	Emulated []string
}

// NoBackendError is returned when no provider can carry a transfer.
type NoBackendError struct {
	Locality Locality
	Found    []string // provider/fabric/domain of every info considered
	Skipped  []string
}

func (e *NoBackendError) Error() string {
	found := "none"
	if len(e.Found) > 0 {
		found = strings.Join(e.Found, ", ")
	}
	msg := fmt.Sprintf("no backend for a %s peer: need an RDM endpoint with FI_RMA from efa, shm (same node) or tcp;ofi_rxm; found: %s", e.Locality, found)
	if len(e.Skipped) > 0 {
		msg += "; passed over: " + strings.Join(e.Skipped, "; ")
	}
	return msg
}

// Select picks the backend for a peer: same process → memcpy; same node →
// shm when present; then efa-direct with FI_RMA (device read and write),
// efa with device RMA, efa with emulated RMA (only under AllowEmulatedRMA,
// and the choice names the emulated ops), tcp;ofi_rxm. Infos that are not
// RDM endpoints with RMACaps are ignored. It is a pure function.
func Select(infos []Info, loc Locality, policy RMAPolicy, facts Facts) (Choice, error) {
	if loc == SameProcess {
		return Choice{Backend: BackendMemcpy, Reason: "memcpy: both buffers are in this process"}, nil
	}
	var usable []*Info
	var found []string
	for i := range infos {
		in := &infos[i]
		found = append(found, describeInfo(in))
		if in.EP.Type == EPRDM && in.Caps.Has(RMACaps) {
			usable = append(usable, in)
		}
	}
	var skipped []string
	done := func(c Choice) (Choice, error) {
		c.Skipped = skipped
		return c, nil
	}

	if loc == SameNode {
		if in := first(usable, isSHM); in != nil {
			return done(Choice{Backend: BackendSHM, Info: in, Reason: "shm: peer is on this node"})
		}
		skipped = append(skipped, "shm: not available")
	}

	if in := first(usable, isEFADirect); in != nil {
		return done(Choice{Backend: BackendEFADirect, Info: in,
			Reason: "efa-direct: device does RDMA read and write (" + in.Domain.Name + ")"})
	}
	for _, in := range usable {
		if !isEFARDM(in) {
			continue
		}
		if facts.EFAEndpoint != nil {
			skipped = append(skipped, "efa: "+facts.EFAEndpoint.Error())
			break
		}
		rma := facts.DeviceRMA[in.Domain.Name]
		emulated := emulatedOps(rma)
		if len(emulated) == 0 {
			return done(Choice{Backend: BackendEFA, Info: in,
				Reason: "efa: device does RDMA read and write (" + in.Domain.Name + ")"})
		}
		why := "efa: " + deviceClass(rma)
		if policy == AllowEmulatedRMA {
			return done(Choice{Backend: BackendEFA, Info: in, Emulated: emulated,
				Reason: why + "; using efa with " + strings.Join(emulated, " and ") +
					" emulated by the provider (the target must progress)"})
		}
		skipped = append(skipped, why+"; emulated RMA not allowed (policy "+policy.String()+")")
		break
	}

	if in := first(usable, isTCP); in != nil {
		reason := "tcp;ofi_rxm"
		switch {
		case len(skipped) > 0:
			reason = skipped[len(skipped)-1] + "; using tcp;ofi_rxm"
		case loc == Remote:
			reason = "tcp;ofi_rxm: no RDMA provider (efa) on this machine"
		}
		return done(Choice{Backend: BackendTCP, Info: in, Reason: reason})
	}
	return Choice{}, &NoBackendError{Locality: loc, Found: found, Skipped: skipped}
}

func describeInfo(in *Info) string {
	s := in.Fabric.ProvName
	if in.Fabric.Name != "" && in.Fabric.Name != in.Fabric.ProvName {
		s += "/" + in.Fabric.Name
	}
	return s + " (" + in.EP.Type.String() + ")"
}

func emulatedOps(r DeviceRMA) []string {
	var out []string
	if r.Read != Yes {
		out = append(out, "read")
	}
	if r.Write != Yes {
		out = append(out, "write")
	}
	return out
}

// deviceClass says where RMA runs on the endpoint, in words users search
// for. It names what the endpoint reports, not the hardware: an endpoint
// emulates both when its use_device_rdma is off, which the variable can do
// on hardware with RDMA (efa_rdm_ep.h@v2.1.0:320-345).
func deviceClass(r DeviceRMA) string {
	switch {
	case r.Read == Yes && r.Write == No:
		return "RDMA read on the device, write emulated (P4d-class: the device or this libfabric has no device RDMA write)"
	case r.Read == No && r.Write == No:
		return "read and write emulated: device RDMA is off on this endpoint (" + EnvUseDeviceRDMA + " off, or no RDMA read on the device)"
	case r.Read == No && r.Write == Yes:
		return "read emulated, write on the device"
	case r.Read == Unknown && r.Write == Unknown:
		return "cannot tell whether RMA runs on the device (needs libfabric API 1.18+ for FI_OPT_EFA_EMULATED_READ/WRITE)"
	case r.Read == Unknown && r.Write == No:
		return "write emulated (libfabric 1.17 has no device RDMA write); cannot tell whether read runs on the device (libfabric API 1.18+ can)"
	}
	return fmt.Sprintf("RDMA read on the device: %s, write: %s", r.Read, r.Write)
}

func isSHM(in *Info) bool { return in.Fabric.ProvName == "shm" }

func isTCP(in *Info) bool { return in.Fabric.ProvName == "tcp;ofi_rxm" }

func isEFADirect(in *Info) bool {
	return in.Fabric.ProvName == "efa" && in.Fabric.Name == "efa-direct" && in.EP.Type == EPRDM
}

func isEFARDM(in *Info) bool {
	return in.Fabric.ProvName == "efa" && in.Fabric.Name != "efa-direct" && in.EP.Type == EPRDM
}

func first(infos []*Info, pred func(*Info) bool) *Info {
	for _, in := range infos {
		if pred(in) {
			return in
		}
	}
	return nil
}
