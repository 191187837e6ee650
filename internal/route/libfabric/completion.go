package libfabric

import "github.com/fitransfer/fitransfer/fabric"

// Completion is what a write's completion must mean, as its caller asked:
// the weaker, the sooner it may complete.
type Completion uint8

const (
	// Delivered: the bytes are visible in the target's memory (the default).
	Delivered Completion = iota
	// Transmitted: the data left the local buffer toward the target
	// (transport.WithTransmitComplete).
	Transmitted
	// SourceFree: only that the local buffer may be reused
	// (transport.Action.InjectComplete).
	SourceFree
)

// WriteFlags is the completion flag of a write that asks for want, toward
// an owner the kernel verified (verified) whom process_vm_readv reaches
// (reaches).
//
//   - SourceFree on tcp;ofi_rxm is FI_INJECT_COMPLETE: the tcp provider
//     answers every write that asks for transmit or delivery completion
//     with an acknowledgement from the owner (xnet_set_ack_flags,
//     prov/tcp/src/xnet.h), a message back and a system call on each side.
//     On the other providers a SourceFree write completes as a Delivered
//     one: measured, nothing there gains from it (docs/PERFORMANCE.md).
//   - Transmitted is FI_TRANSMIT_COMPLETE.
//   - On shm, a verified owner that process_vm_readv reaches gets
//     FI_TRANSMIT_COMPLETE: shm's single copy lands the bytes before it
//     completes (see shm.go).
//   - Otherwise FI_DELIVERY_COMPLETE.
func (r *Route) WriteFlags(want Completion, verified, reaches bool) uint64 {
	switch {
	case want == SourceFree && r.Provider == fabric.BackendTCP:
		return uint64(fabric.OpInjectComplete)
	case want == Transmitted:
		return uint64(fabric.OpTransmitComplete)
	case r.Provider != fabric.BackendSHM || !verified || !shmSingleCopyAllowed():
		return uint64(fabric.OpDeliveryComplete)
	case reaches:
		return uint64(fabric.OpTransmitComplete)
	}
	return uint64(fabric.OpDeliveryComplete)
}
