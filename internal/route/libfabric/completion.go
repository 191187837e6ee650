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

// Completion is what a write of n bytes on r must wait for when its
// manager asked for transmit completion (transmit) and its action let it
// complete once its source may be reused (sourceFree): SourceFree over
// tcp;ofi_rxm, where it spares each write the owner's acknowledgement
// (see WriteFlags), and over libfabric 2.x's shm for writes of at most
// ShmInlineMax bytes; elsewhere what the manager asked for. A larger
// shm write would end its mark, which the owner's Close waits for,
// before the owner's provider has copied it (shm.go); on 1.x, shm's
// single copy completes a write once copied anyway; efa is unmeasured.
func (r *Route) Completion(transmit, sourceFree bool, n uint64) Completion {
	return CompletionOver(r.Provider, transmit, sourceFree, n)
}

// CompletionOver is Route.Completion for a route over provider.
func CompletionOver(provider fabric.Backend, transmit, sourceFree bool, n uint64) Completion {
	switch {
	case sourceFree && provider == fabric.BackendTCP:
		return SourceFree
	case sourceFree && provider == fabric.BackendSHM && n <= ShmInlineMax && shmOwnerCopies():
		return SourceFree
	case transmit:
		return Transmitted
	}
	return Delivered
}

// WriteFlags is the completion flag of a write that asks for want, toward
// an owner the kernel verified (verified) whom process_vm_readv reaches
// (reaches).
//
//   - SourceFree is FI_INJECT_COMPLETE. The tcp provider answers every
//     write that asks for transmit or delivery completion with an
//     acknowledgement from the owner (xnet_set_ack_flags,
//     prov/tcp/src/xnet.h), a message back and a system call on each side;
//     2.x's shm moves a delivery-complete write through its bounce
//     buffers (SAR) over several rounds of the owner's progress, where a
//     small one without that flag rides in its command.
//   - Transmitted is FI_TRANSMIT_COMPLETE.
//   - On shm, a verified owner that process_vm_readv reaches gets
//     FI_TRANSMIT_COMPLETE: shm's single copy lands the bytes before it
//     completes (see shm.go).
//   - Otherwise FI_DELIVERY_COMPLETE.
func (r *Route) WriteFlags(want Completion, verified, reaches bool) uint64 {
	return WriteFlagsOver(r.Provider, want, verified, reaches)
}

// WriteFlagsOver is Route.WriteFlags for a route over provider.
func WriteFlagsOver(provider fabric.Backend, want Completion, verified, reaches bool) uint64 {
	switch {
	case want == SourceFree:
		return uint64(fabric.OpInjectComplete)
	case want == Transmitted:
		return uint64(fabric.OpTransmitComplete)
	case provider != fabric.BackendSHM || !verified || !shmSingleCopyAllowed():
		return uint64(fabric.OpDeliveryComplete)
	case reaches:
		return uint64(fabric.OpTransmitComplete)
	}
	return uint64(fabric.OpDeliveryComplete)
}
