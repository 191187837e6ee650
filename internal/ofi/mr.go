package ofi

/*
#include "ofi.h"
*/
import "C"

import "unsafe"

// Access bits of a memory registration (fi_mr_attr.access); they are the
// capability bits of the same names.
const (
	AccessRead        = uint64(CapRead)        // local: result buffer of a read
	AccessWrite       = uint64(CapWrite)       // local: source buffer of a write
	AccessRemoteRead  = uint64(CapRemoteRead)  // peers may read it
	AccessRemoteWrite = uint64(CapRemoteWrite) // peers may write it
)

// HMEM interfaces (enum fi_hmem_iface) fitransfer knows.
const (
	HMEMSystem = 0 // FI_HMEM_SYSTEM
	HMEMCUDA   = 1 // FI_HMEM_CUDA
)

// MR is a registered memory region.
type MR struct {
	c    *C.struct_fid_mr
	key  uint64
	desc Desc
}

// Desc is a local memory descriptor (fi_mr_desc): the provider's, opaque,
// passed back with each op on the memory. Its own type keeps the packages
// above from handling an unsafe.Pointer.
type Desc unsafe.Pointer

// RegMR registers n bytes at addr (fi_mr_regattr): host memory off the Go
// heap, or device memory — an address, never a Go pointer with the given access,
// asking for key (ignored by providers with FI_MR_PROV_KEY). iface and
// device name the memory's HMEM interface (HMEMSystem for host memory).
// With bindTo set (domains with FI_MR_ENDPOINT) the MR is bound to that
// endpoint and enabled. The memory must stay mapped until Close.
func (d *Domain) RegMR(addr uintptr, n uint64, access, key uint64, iface, device int, bindTo *Endpoint) (*MR, error) {
	var ep *C.struct_fid_ep
	if bindTo != nil {
		ep = bindTo.e.ep
	}
	m := &MR{}
	var stage *C.char
	rc := C.ft_mr_reg(d.c, ep, C.uint64_t(addr), C.size_t(n), C.uint64_t(access), C.uint64_t(key),
		C.int(iface), C.int(device), &m.c, &stage)
	if rc != 0 {
		return nil, check(C.GoString(stage), rc)
	}
	m.key = uint64(C.fi_mr_key(m.c))
	m.desc = Desc(C.fi_mr_desc(m.c))
	return m, nil
}

// Key is the key peers use to reach the region (fi_mr_key).
func (m *MR) Key() uint64 { return m.key }

// Desc is the local descriptor passed with ops on this memory (fi_mr_desc).
func (m *MR) Desc() Desc { return m.desc }

// Close deregisters the region; closing twice is a no-op.
func (m *MR) Close() error {
	if m == nil || m.c == nil {
		return nil
	}
	err := check("fi_close(mr)", C.fi_close(&m.c.fid))
	m.c = nil
	return err
}
