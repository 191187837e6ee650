package ofi

/*
#include "ofi.h"
*/
import "C"

import (
	"unsafe"
)

// Endpoint is an enabled RDM endpoint with its address vector (FI_AV_TABLE),
// completion queue (FI_CQ_FORMAT_CONTEXT, polled) and event queue. Its
// data-path methods are not safe for concurrent use: one goroutine (the
// progress loop) drives an endpoint.
type Endpoint struct {
	e        C.struct_ft_ep
	name     []byte
	waitable bool
	eqMsg    *C.char // C buffer PollEQ reads messages into
}

const eqMsgLen = 256

// OpenEndpoint opens, binds and enables an endpoint on the domain, with the
// fi_info the domain was opened from. cqSize 0 lets the provider choose.
// With cqWait the CQ gets a wait object if the provider has one (see
// Waitable).
func (d *Domain) OpenEndpoint(cqSize int, cqWait bool) (*Endpoint, error) {
	ep := &Endpoint{}
	var stage *C.char
	wait, waitable := C.int(0), C.int(0)
	if cqWait {
		wait = 1
	}
	if rc := C.ft_ep_open(d.fabric, d.c, d.info, C.size_t(cqSize), wait, &waitable, &ep.e, &stage); rc != 0 {
		return nil, check(C.GoString(stage), rc)
	}
	ep.waitable = waitable == 1
	ep.eqMsg = (*C.char)(C.calloc(eqMsgLen, 1))
	name, err := ep.getName()
	if err != nil {
		C.ft_ep_close(&ep.e)
		return nil, err
	}
	ep.name = name
	return ep, nil
}

func (ep *Endpoint) getName() ([]byte, error) {
	buf := make([]byte, 256)
	n := C.size_t(len(buf))
	rc := C.fi_getname(&ep.e.ep.fid, unsafe.Pointer(&buf[0]), &n)
	if rc == -C.FI_ETOOSMALL {
		buf = make([]byte, n)
		rc = C.fi_getname(&ep.e.ep.fid, unsafe.Pointer(&buf[0]), &n)
	}
	if err := check("fi_getname", rc); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// Waitable reports whether the CQ has a wait object: Wait may block in
// fi_cq_sread and Signal wakes it.
func (ep *Endpoint) Waitable() bool { return ep.waitable }

// Signal wakes a Wait in progress (fi_cq_signal). Safe from any goroutine.
func (ep *Endpoint) Signal() {
	if ep.waitable {
		C.fi_cq_signal(ep.e.cq)
	}
}

// Name is the endpoint's address as fi_getname returns it; a peer passes it
// to InsertAddr.
func (ep *Endpoint) Name() []byte { return ep.name }

// InsertAddr adds a peer's endpoint name to the address vector and returns
// its fi_addr_t.
func (ep *Endpoint) InsertAddr(name []byte) (uint64, error) {
	if len(name) == 0 {
		return 0, &CallError{Call: "fi_av_insert", Errno: ErrInval}
	}
	p := C.CBytes(name)
	defer C.free(p)
	var addr C.uint64_t
	if err := check("fi_av_insert", C.ft_av_insert(&ep.e, p, &addr)); err != nil {
		return 0, err
	}
	return uint64(addr), nil
}

// RemoveAddr removes a peer from the address vector (fi_av_remove); a
// later InsertAddr of the same name gets a fresh connection on
// connection-oriented providers (tcp;ofi_rxm).
func (ep *Endpoint) RemoveAddr(addr uint64) error {
	return check("fi_av_remove", C.ft_av_remove(&ep.e, C.uint64_t(addr)))
}

// MaxRMASize is fi_getopt(FI_OPT_MAX_RMA_SIZE) (libfabric 1.22+); an error
// wrapping ErrNoSys or ErrNoProtoOpt when unavailable.
func (ep *Endpoint) MaxRMASize() (uint64, error) {
	var n C.size_t
	if err := check("fi_getopt(FI_OPT_MAX_RMA_SIZE)", C.ft_ep_max_rma_size(ep.e.ep, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// PollEQ reads one event queue entry: the provider's message for an
// asynchronous error, or "" when there was none.
func (ep *Endpoint) PollEQ() (string, error) {
	rc := C.ft_eq_poll(ep.e.eq, ep.eqMsg, eqMsgLen)
	switch {
	case rc < 0:
		return "", check("fi_eq_read", rc)
	case rc == 1:
		return C.GoString(ep.eqMsg), nil
	}
	return "", nil
}

// Close closes the endpoint, its AV, CQ and EQ; closing twice is a no-op.
// Memory registrations bound to it must be closed first.
func (ep *Endpoint) Close() {
	if ep == nil {
		return
	}
	C.ft_ep_close(&ep.e)
	if ep.eqMsg != nil {
		C.free(unsafe.Pointer(ep.eqMsg))
		ep.eqMsg = nil
	}
}

// ProbeEFAEmulated opens a throwaway endpoint (not enabled) and asks the
// efa provider whether it emulates RMA read and write:
// fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE), libfabric 1.18+. Built against
// older headers, or on a provider without the option, it returns an error
// wrapping ErrNoSys or ErrNoProtoOpt.
func (d *Domain) ProbeEFAEmulated() (read, write bool, err error) {
	var ep *C.struct_fid_ep
	if err := check("fi_endpoint", C.fi_endpoint(d.c, d.info, &ep, nil)); err != nil {
		return false, false, err
	}
	defer C.fi_close(&ep.fid)
	r := C.ft_ep_efa_emulated(ep, 0)
	if err := check("fi_getopt(FI_OPT_EFA_EMULATED_READ)", r); err != nil {
		return false, false, err
	}
	w := C.ft_ep_efa_emulated(ep, 1)
	if err := check("fi_getopt(FI_OPT_EFA_EMULATED_WRITE)", w); err != nil {
		return false, false, err
	}
	return r == 1, w == 1, nil
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
