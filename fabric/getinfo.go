package fabric

import (
	"fmt"
	"strings"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// Versions describes the libfabric fitransfer runs against.
type Versions struct {
	Library  string  `json:"library"`  // release of the loaded library, e.g. "1.17.0"
	Runtime  Version `json:"runtime"`  // fi_version() of the loaded library
	Compiled Version `json:"compiled"` // FI_VERSION of the headers at build time
	API      Version `json:"api"`      // what fitransfer asks for: min(Compiled, Runtime)
}

// CurrentVersions reports the loaded library and the negotiated API version.
func CurrentVersions() Versions {
	return Versions{
		Library:  ofi.LibraryVersion(),
		Runtime:  ofi.RuntimeVersion(),
		Compiled: ofi.CompiledVersion(),
		API:      ofi.NegotiatedVersion(),
	}
}

// APIVersion is the API version fitransfer passes to fi_getinfo: the older
// of the compiled and the runtime version (a newer one gets -FI_ENOSYS).
func APIVersion() Version { return ofi.NegotiatedVersion() }

// Query is one fi_getinfo call.
type Query struct {
	Hints         *Info   // nil: no hints (everything the providers offer)
	Node          string  // destination (or, with Source, local) node
	Service       string  // destination (or, with Source, local) port
	Source        bool    // FI_SOURCE: Node and Service name the local address
	ProvidersOnly bool    // FI_PROV_ATTR_ONLY: only provider names and versions
	Version       Version // zero: APIVersion()
}

// GetInfoError is a failed fi_getinfo with a description of what was asked.
// errors.Is(err, ErrNoData) tells "nothing matched" from other failures.
type GetInfoError struct {
	Query Query
	Err   error
}

func (e *GetInfoError) Error() string {
	return fmt.Sprintf("fi_getinfo (API %s%s): %v", e.version(), e.describe(), unwrapCall(e.Err))
}

// Unwrap exposes the libfabric error.
func (e *GetInfoError) Unwrap() error { return e.Err }

func (e *GetInfoError) version() Version {
	if e.Query.Version != 0 {
		return e.Query.Version
	}
	return APIVersion()
}

func (e *GetInfoError) describe() string {
	var parts []string
	if h := e.Query.Hints; h != nil {
		if h.Fabric.ProvName != "" {
			parts = append(parts, "provider "+h.Fabric.ProvName)
		}
		if h.Fabric.Name != "" {
			parts = append(parts, "fabric "+h.Fabric.Name)
		}
		if h.Domain.Name != "" {
			parts = append(parts, "domain "+h.Domain.Name)
		}
		if h.EP.Type != 0 {
			parts = append(parts, "endpoint "+h.EP.Type.String())
		}
		if h.Caps != 0 {
			parts = append(parts, "caps "+h.Caps.String())
		}
	}
	if e.Query.Node != "" || e.Query.Service != "" {
		parts = append(parts, "node "+e.Query.Node+":"+e.Query.Service)
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ")
}

func unwrapCall(err error) error {
	if ce, ok := err.(*CallError); ok {
		return ce.Errno
	}
	return err
}

// GetInfo runs fi_getinfo and returns every fi_info as a Go value, in the
// provider's order.
func GetInfo(q Query) ([]Info, error) {
	if err := EFAGetInfoGate(); err != nil {
		return nil, err
	}
	if q.Hints != nil && q.Hints.Caps&CapHMEM != 0 {
		if err := efaHMEMGate(); err != nil {
			return nil, err
		}
	}
	v := q.Version
	if v == 0 {
		v = APIVersion()
	}
	var flags uint64
	if q.Source {
		flags |= ofi.GetInfoSource
	}
	if q.ProvidersOnly {
		flags |= ofi.GetInfoProvAttrOnly
	}
	infos, err := ofi.GetInfo(v, q.Node, q.Service, flags, q.Hints)
	if err != nil {
		return nil, &GetInfoError{Query: q, Err: err}
	}
	return infos, nil
}

// RMACaps are the capabilities fitransfer needs: one-sided read and write
// in both directions, plus messages.
const RMACaps = CapMsg | CapRMA | CapRead | CapWrite | CapRemoteRead | CapRemoteWrite

// SupportedMRMode is every memory registration mode fitransfer handles.
const SupportedMRMode = MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MREndpoint

// WithHMEM adds device memory to hints: the FI_HMEM capability and the
// FI_MR_HMEM registration mode. fitransfer asks for them only when device
// memory is wanted (transport.WithDeviceMemory): providers without HMEM
// support then do not answer.
func WithHMEM(h *Info) *Info {
	h.Caps |= CapHMEM
	h.Domain.MRMode |= MRHMEM
	return h
}

// RMAHints are the hints fitransfer asks providers with: an RDM endpoint
// with RMACaps, the MR modes it supports, FI_AV_TABLE and the op-context
// modes (it passes an fi_context2 with every op). It never hints
// FI_PROGRESS_AUTO (2.1+ efa answers -FI_ENODATA to it). provider may be
// empty; it may name a provider ("shm", "tcp;ofi_rxm", "efa").
func RMAHints(provider string) *Info {
	h := &Info{Caps: RMACaps, Mode: ofi.ModeContext | ofi.ModeContext2}
	h.EP.Type = EPRDM
	h.Domain.MRMode = SupportedMRMode
	h.Domain.AVType = ofi.AVTable
	h.Fabric.ProvName = provider
	return h
}

// WithoutShmFastRMA asks shm for read-after-read ordering, which turns off
// its "fast RMA" path. shm takes that path when the hints allow
// FI_MR_VIRT_ADDR and ask for no RMA ordering (smr_fast_rma_enabled,
// prov/shm/src/smr.h, v1.17.0 and v2.1.0): the initiator copies with
// process_vm_readv/writev itself and only then tells the target. In
// libfabric 2.x it claims a slot of the target's command queue before the
// copy and commits it after (smr_rma_fast, prov/shm/src/smr_rma.c,
// v2.1.0), so an initiator killed mid-copy leaves a slot that is never
// committed, and the target never reads its queue again: every later peer
// waits forever. The path also skips the target's key check. Without it,
// the target copies during its own progress, checks the key, and a dead
// initiator costs one failed op.
func WithoutShmFastRMA(h *Info) *Info {
	h.Tx.MsgOrder |= ofi.OrderRAR
	return h
}

// ShmFastRMAOff reports whether an shm endpoint of in runs without fast
// RMA: in, hints or what shm returned for them, has read-after-read
// order (WithoutShmFastRMA), which shm clears from what it returns when
// it takes the fast path (smr_getinfo, prov/shm/src/smr_init.c).
func ShmFastRMAOff(in *Info) bool { return in.Tx.MsgOrder&ofi.OrderRAR != 0 }
