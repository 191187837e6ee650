// Package fabric is fitransfer's view of libfabric's discovery layer: API
// version negotiation, fi_getinfo as Go values, fabric and domain lifetime,
// libfabric error numbers, fi_info-style formatting, and the policy that
// picks a backend (efa-direct, efa, shm, tcp;ofi_rxm) for a peer.
//
// The Info attribute types are defined in internal/ofi, the module's only
// cgo package, and aliased here; everything in this package is plain Go.
// Select is a pure function over []Info, so the EFA cases (P4d, P5, P5en)
// are tested with synthetic infos on machines without an EFA device.
package fabric
