// Package fabric is fitransfer's view of libfabric's discovery layer: API
// version negotiation, fi_getinfo as Go values, fabric and domain lifetime,
// libfabric error numbers, fi_info-style formatting, and the policy that
// picks a backend (efa-direct, efa, shm, tcp;ofi_rxm) for a peer.
//
// The Info attribute types are defined in internal/ofi, the module's only
// cgo package, and aliased here; everything in this package is plain Go.
// Select is a pure function over []Info, so the EFA cases are tested on
// machines without an EFA device, with published fi_info outputs of p4d
// and p5 read back by ParseFiInfoText (testdata/fi_info). Where a libfabric
// call can abort() the process, a probe child makes it first
// (EFAGetInfoGate, EFAEndpointGate, ProbeDeviceRMA).
//
// Package init handles the probe child: a process started with
// FITRANSFER_EFA_PROBE set runs the probe and exits before main or
// TestMain.
package fabric
