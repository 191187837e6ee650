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
// (see WriteFlags), and over shm where the owner's provider copies every
// write (ShmOwnerCopies) for writes of at most ShmInlineMax bytes;
// elsewhere what the manager asked for. A larger shm write would end its
// mark, which the owner's Close waits for, before the owner's provider
// has copied it (shm.go); 1.x's shm copies a write toward an owner that
// process_vm_readv reaches before it completes it anyway; efa is
// unmeasured.
func (r *Route) Completion(transmit, sourceFree bool, n uint64) Completion {
	return CompletionOver(r.Provider, r.Provider == fabric.BackendSHM && ShmOwnerCopies(&r.Info), transmit, sourceFree, n)
}

// CompletionOver is Route.Completion for a route over provider;
// ownerCopies: over shm, ShmOwnerCopies of its endpoint's info.
func CompletionOver(provider fabric.Backend, ownerCopies, transmit, sourceFree bool, n uint64) Completion {
	switch {
	case sourceFree && provider == fabric.BackendTCP:
		return SourceFree
	case sourceFree && provider == fabric.BackendSHM && ownerCopies && n <= ShmInlineMax:
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
//     2.x's shm makes a delivery-complete write wait for the owner's
//     progress and its answer (2.0 to 2.4 move it through bounce buffers,
//     SAR, over several rounds), where a small one without that flag
//     rides in its command and completes when posted.
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
