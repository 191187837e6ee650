package fabric

import "errors"

// ProbeDeviceRMA finds out, for every efa domain in infos, whether RMA on
// an endpoint of it runs on the device, and whether efa RDM endpoints may
// be opened at all (Facts.EFAEndpoint):
//   - an efa-direct info with FI_RMA means read and write on the device:
//     libfabric 2.1–2.3 claims FI_RMA there only when the device has RDMA
//     read, write and unsolicited write recv (efa_prov_info.c@v2.1.0:474-479,
//     @v2.3.0:474-486), 2.4+ with read and write
//     (efa_prov_info.c@v2.4.0:474-484);
//   - for the efa fabric on libfabric 1.18+, a probe child opens an
//     endpoint on each domain — the call that may abort() there — and,
//     with API 1.18+ headers and library, asks
//     fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE); an abort in the child
//     becomes Facts.EFAEndpoint and the efa fabric is not used;
//   - on libfabric 1.17, which has no device RDMA write and reads
//     FI_EFA_USE_DEVICE_RDMA once at provider init, the setting decides
//     read (see gate.facts) and write is emulated.
//
// The answers describe this endpoint (its use_device_rdma and device), not
// the peer: the efa fabric takes the device path per operation only when
// the peer supports it too (efa_rdm_rma.c@v2.1.0:347).
func ProbeDeviceRMA(infos []Info) Facts {
	return currentGate().facts(infos)
}

// errNotProbed is returned when the libfabric in use cannot answer.
var errNotProbed = errors.New("libfabric cannot report emulated RMA (needs API 1.18+)")
