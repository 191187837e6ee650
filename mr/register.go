package mr

import (
	"errors"
	"fmt"

	"github.com/fitransfer/fitransfer/fabric"
)

// Target is where memory is registered: an open domain, the endpoint its
// registrations are bound to when the provider asks for that
// (FI_MR_ENDPOINT), and the domain's attributes, whose mr_mode and key
// size decide how keys are chosen.
type Target struct {
	Provider string // for errors, e.g. "tcp;ofi_rxm"
	Domain   *fabric.Domain
	Endpoint *fabric.Endpoint
	Attr     fabric.DomainAttr
}

// Region is memory to register: n bytes at Addr, host memory off the Go
// heap (Alloc, Adopt) or device memory (Iface and Device say which).
type Region struct {
	Addr   uintptr
	Len    uint64
	Access Access
	Iface  Iface
	Device int
}

// HostRegion is the Region of host memory mem.
func HostRegion(mem []byte, access Access) Region {
	return Region{Addr: Addr(mem), Len: uint64(len(mem)), Access: access, Iface: Host}
}

// maxKeyTries bounds the draws when a random key is already taken.
const maxKeyTries = 16

// Register registers r on t's domain. Without FI_MR_PROV_KEY the key is
// fitransfer's: a random one of the domain's key size (RandomKey), drawn
// again when the provider answers -FI_ENOKEY (taken); with
// FI_MR_PROV_KEY the provider picks it. With FI_MR_ENDPOINT the
// registration is bound to t.Endpoint and enabled, as the provider
// requires before the key is valid.
func Register(t Target, r Region) (*fabric.MR, error) {
	var bind *fabric.Endpoint
	if t.Attr.MRMode.Has(fabric.MREndpoint) {
		bind = t.Endpoint
	}
	provKey := t.Attr.MRMode.Has(fabric.MRProvKey)
	for try := 0; ; try++ {
		key := uint64(0)
		if !provKey {
			key = RandomKey(t.Attr.MRKeySize)
		}
		m, err := t.Domain.RegMR(r.Addr, r.Len, r.Access.Bits(), key, int(r.Iface), r.Device, bind)
		if err == nil {
			return m, nil
		}
		if errors.Is(err, fabric.ErrNoKey) && !provKey && try < maxKeyTries {
			continue
		}
		if r.Iface != Host {
			return nil, fmt.Errorf("%s: register %d bytes of %v memory (device %d): %w%s", t.Provider, r.Len, r.Iface, r.Device, err, hmemHint(err))
		}
		return nil, fmt.Errorf("%s: register %d bytes: %w", t.Provider, r.Len, err)
	}
}

// hmemHint explains a failed device memory registration.
func hmemHint(err error) string {
	if errors.Is(err, fabric.ErrNoSys) || errors.Is(err, fabric.ErrOpNotSupp) || errors.Is(err, fabric.ErrInval) {
		return "; this libfabric or machine cannot register that device memory (no CUDA runtime or GPU found, or libfabric built without CUDA support)"
	}
	return ""
}
