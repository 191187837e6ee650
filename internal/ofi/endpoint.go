package ofi

/*
#include "ofi.h"
*/
import "C"

// Endpoint is an open fid_ep.
type Endpoint struct {
	c *C.struct_fid_ep
}

// OpenEndpoint opens an endpoint on the domain with the fi_info the domain
// was opened from (fi_endpoint). It is neither bound nor enabled.
func (d *Domain) OpenEndpoint() (*Endpoint, error) {
	ep := &Endpoint{}
	if err := check("fi_endpoint", C.fi_endpoint(d.c, d.info, &ep.c, nil)); err != nil {
		return nil, err
	}
	return ep, nil
}

// Close closes the endpoint; closing twice is a no-op.
func (ep *Endpoint) Close() error {
	if ep == nil || ep.c == nil {
		return nil
	}
	err := check("fi_close(ep)", C.fi_close(&ep.c.fid))
	ep.c = nil
	return err
}

// EFAEmulated asks an efa endpoint whether it emulates RMA read (write
// false) or write (write true) instead of using the device:
// fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE), libfabric 1.18+. Built against
// older headers, or run on a provider without the option, it returns an
// error wrapping ErrNoSys or ErrNoProtoOpt.
func (ep *Endpoint) EFAEmulated(write bool) (bool, error) {
	w := C.int(0)
	if write {
		w = 1
	}
	rc := C.ft_ep_efa_emulated(ep.c, w)
	if err := check("fi_getopt(FI_OPT_EFA_EMULATED)", rc); err != nil {
		return false, err
	}
	return rc == 1, nil
}

// MaxRMASize is fi_getopt(FI_OPT_MAX_RMA_SIZE) (libfabric 1.22+); an error
// wrapping ErrNoSys or ErrNoProtoOpt when unavailable.
func (ep *Endpoint) MaxRMASize() (uint64, error) {
	var n C.size_t
	if err := check("fi_getopt(FI_OPT_MAX_RMA_SIZE)", C.ft_ep_max_rma_size(ep.c, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// HeadersHave reports which optional libfabric features the headers this
// binary was compiled with declare.
type HeadersHave struct {
	EFAEmulatedOpts  bool `json:"efa_emulated_opts"`    // FI_OPT_EFA_EMULATED_READ/WRITE (1.18)
	CUDAAPIPermitted bool `json:"cuda_api_permitted"`   // FI_OPT_CUDA_API_PERMITTED (1.18)
	SharedMemPermit  bool `json:"shared_mem_permitted"` // FI_OPT_SHARED_MEMORY_PERMITTED (1.22)
	MaxRMASize       bool `json:"max_rma_size"`         // FI_OPT_MAX_RMA_SIZE (1.22)
	EFADirectFabric  bool `json:"efa_direct_fabric"`    // the efa-direct fabric (2.1)
}

// CompiledFeatures reports the optional features of the compiled headers.
func CompiledFeatures() HeadersHave {
	v := CompiledVersion()
	return HeadersHave{
		EFAEmulatedOpts:  v.AtLeast(1, 18),
		CUDAAPIPermitted: v.AtLeast(1, 18),
		SharedMemPermit:  v.AtLeast(1, 22),
		MaxRMASize:       v.AtLeast(1, 22),
		EFADirectFabric:  v.AtLeast(2, 1),
	}
}
