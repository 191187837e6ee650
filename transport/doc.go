// Package transport is fitransfer's user API: a Manager registers local
// memory as Buffers, hands out RemoteBuffer handles for peers, and moves
// bytes with one-sided RMA: ReadInto pulls a peer's buffer into a local
// one, WriteFrom pushes a local buffer into a peer's, and an Action submits
// many of both at once.
//
// Transfers are routed by where the owner of the remote buffer runs: in
// the same manager, a memcpy; on the same node, shm; elsewhere the
// inter-node backend (efa-direct, efa or tcp;ofi_rxm, see
// fabric.Select). They are split into chunks no larger than the provider
// allows, with no more ops in flight than the endpoint's transmit queue
// and completion queue hold, and every chunk asks for a completion.
//
// A nil error from WriteFrom means the bytes are visible in the target's
// memory (FI_DELIVERY_COMPLETE), unless the manager was created with
// WithTransmitComplete. For device (GPU) memory, a completion does not by
// itself make the bytes visible to kernels on the device; see docs/EFA.md.
//
// Every method is safe for concurrent use. Every wait has a deadline: the
// context's, or the manager's default timeout when the context has none.
package transport
