package ofi

/*
#include "ofi.h"
*/
import "C"

// Fabric is an open fid_fabric.
type Fabric struct {
	c *C.struct_fid_fabric
}

// Domain is an open fid_domain, with the fi_info it was opened from kept in
// C for the endpoints opened on it.
type Domain struct {
	c      *C.struct_fid_domain
	fabric *C.struct_fid_fabric
	info   *C.struct_fi_info
}

// OpenFabric opens the fabric an Info names (fi_fabric).
func OpenFabric(i *Info) (*Fabric, error) {
	ci, err := toC(i)
	if err != nil {
		return nil, err
	}
	defer C.fi_freeinfo(ci)
	f := &Fabric{}
	var rc C.int
	initialize(func() { rc = C.fi_fabric(ci.fabric_attr, &f.c, nil) })
	if err := check("fi_fabric", rc); err != nil {
		return nil, err
	}
	return f, nil
}

// Close closes the fabric; closing twice is a no-op.
func (f *Fabric) Close() error {
	if f == nil || f.c == nil {
		return nil
	}
	err := check("fi_close(fabric)", C.fi_close(&f.c.fid))
	f.c = nil
	return err
}

// OpenDomain opens the domain an Info names on the fabric (fi_domain).
func (f *Fabric) OpenDomain(i *Info) (*Domain, error) {
	ci, err := toC(i)
	if err != nil {
		return nil, err
	}
	d := &Domain{info: ci, fabric: f.c}
	if err := check("fi_domain", C.fi_domain(f.c, ci, &d.c, nil)); err != nil {
		C.fi_freeinfo(ci)
		return nil, err
	}
	return d, nil
}

// Close closes the domain; closing twice is a no-op. Every endpoint, MR,
// CQ, AV and EQ opened on it must be closed first.
func (d *Domain) Close() error {
	if d == nil || d.c == nil {
		return nil
	}
	err := check("fi_close(domain)", C.fi_close(&d.c.fid))
	C.fi_freeinfo(d.info)
	d.c, d.info = nil, nil
	return err
}
