// Package transport is fitransfer's user API: a Manager registers local
// memory as Buffers, hands out RemoteBuffer handles for peers, and moves
// bytes with one-sided RMA: ReadInto pulls a peer's buffer into a local
// one, WriteFrom pushes a local buffer into a peer's, and an Action submits
// many of both at once.
//
// Transfers are routed by where the owner of the remote buffer runs: in
// the same manager, a memcpy; on the same node, mem (the owner hands the
// initiator the memfd of a whole mr.Alloc allocation peers may read,
// read-only when they may only read, and an op is a copy between
// mappings), else cma — fitransfer's own process_vm_readv/writev, because
// libfabric's shm can leave a process deaf for good when a peer dies
// mid-copy — or libfabric's shm where cma cannot serve (device memory,
// peers process_vm_readv does not reach); elsewhere the inter-node backend
// (efa-direct, efa or tcp;ofi_rxm, see fabric.Select). WithProviders
// forces routes ("mem", "cma", "shm", ...); FITRANSFER_MEM=0 switches mem
// off, as does yama's ptrace_scope above 0 (MemAvailable). Register refuses, with ErrNoRoute, a buffer with
// remote access that none of the manager's routes can share (on a
// mem-only manager: a write-only buffer, or memory that is not a whole
// mr.Alloc allocation). Network transfers are split into chunks no larger
// than the provider allows, with no more ops in flight than the endpoint's
// transmit queue and completion queue hold, and every chunk asks for a
// completion.
//
// A nil error from WriteFrom means the bytes are visible in the target's
// memory (FI_DELIVERY_COMPLETE), unless the manager was created with
// WithTransmitComplete, or the write is one of an Action set to
// InjectComplete (then only that its source may be reused). For device (GPU) memory, a completion does not by
// itself make the bytes visible to kernels on the device; see docs/EFA.md.
// On mem, an owner that died moments before, before this manager saw its
// verifier connection end, is the exception: its pages outlive it in this
// process's mapping, and a write (or read) with them returns nil; ops
// after the manager saw the death fail with ErrPeerGone.
//
// Every method is safe for concurrent use. Every wait has a deadline: the
// context's, or the manager's default timeout when the context has none.
// A context already done when a transfer is asked for returns its error
// before anything moves. A deadline ends a long transfer within the copy
// of one piece on memcpy, mem and cma (4 MiB) and of one part on shm
// (32 MiB), whose single-copy path copies inside libfabric's post calls;
// tcp;ofi_rxm and efa ops end at the deadline, or when the provider call
// under way at it returns (a call is not interrupted; tcp moves bytes
// inside them). Past its deadline nothing more of a transfer is posted,
// and at most 64 MiB of an op (or one chunk, when larger) is in flight on
// an endpoint at once: what the deadline cannot stop, and what may go on
// moving after ErrTimeout.
// A transfer that call completed returns nil: its bytes are there. So
// does one completed by a call begun less than 50 µs after the deadline:
// the loop looks at deadlines at most that often.
//
// # Rails
//
// The remote provider's domains (NICs) are the manager's rails: every
// domain of efa, the domains of tcp;ofi_rxm that WithRails or
// FITRANSFER_RAILS name (Rails reports them). A transfer of at least
// 1 MiB toward an owner reached over them is striped, one piece per rail
// up, sized by link speed and what each rail has queued; a smaller one
// takes one rail near its memory, spread by owner. A rail that fails, or
// has ops out and completes none for a while, is taken out of use: its
// endpoint is closed, which ends whatever it still had in flight (on tcp
// its sockets are set to abort rather than send again what they queued),
// and its pieces go over the other rails — nil still means every byte
// arrived, and nothing of the request arrives later.
// A piece of a later transfer probes it (at most every second) and brings
// it back. When every rail failed, the transfer fails with ErrNoRail,
// wrapping the errors seen, within its deadline.
//
// # Errors
//
// Whatever the route, errors.Is answers the same classes: ErrPeerGone,
// ErrStaleHandle, ErrAccessDenied, ErrOutOfRange, ErrTimeout (with
// context.DeadlineExceeded for a deadline), or context.Canceled; on the
// libfabric routes also ErrEndpointBlocked (shm: ops to a dead peer hold
// its queue) and ErrEndpointWedged (a libfabric call that never returns,
// which Manager.Close reports too). A
// provider's *progress.Error stays underneath (errors.As finds it, with
// its errno, prov_errno, text and hint), and Retryable says whether the
// same request may succeed if made again (a timeout, a busy provider, a
// connection lost to a peer that still listens). Each case gives one class
// per route; test/TestErrorVocabulary checks every cell of this table but
// the efa column, which follows the provider's documented error numbers
// (fabric's hint table):
//
//	case                           memcpy   mem      cma      shm      tcp;ofi_rxm  efa
//	buffer closed by its owner     stale    stale    stale    stale    stale*       stale (prov_errno 7)
//	altered key                    stale    stale    stale    stale    stale*       stale (7)
//	no remote right (its handle)   access   access   access   access   access       access
//	forged access bits             access   access   access   access   stale*       stale (7)
//	range past the buffer          range    range    range    range    stale*       stale (7), range (11)
//	deadline passed                timeout  timeout  timeout  timeout  timeout      timeout
//	context canceled               Canceled Canceled Canceled Canceled Canceled     Canceled
//	owner killed                   -        gone     gone     gone     gone         gone (9, 4124)
//	owner a zombie (not reaped)    -        -        gone     gone     -            -
//
// (stale: ErrStaleHandle, access: ErrAccessDenied, range: ErrOutOfRange,
// timeout: ErrTimeout, gone: ErrPeerGone.) fitransfer checks the handle's
// own access bits and range before any op, and on memcpy, mem, cma and shm
// it checks the owner's record of the buffer too, so it knows which check
// failed. mem shares no write-only buffer, so its access cells are writes
// to buffers peers may only read; a read of a write-only buffer takes
// another route. On tcp;ofi_rxm (*) the owner's provider checks key, range and
// access, and refuses by shutting the connection down: the op fails with
// FI_ECANCELED, and a dial of the owner's endpoint tells a refusal (it
// still listens: ErrStaleHandle, whichever check it was — ops of other
// requests in flight on that connection then read so too) from a dead
// peer (nothing listens: ErrPeerGone). An op posted to a connection
// already lost to an owner that still listens (the next ones after a
// refusal, until rxm reconnects) is posted again until it reaches the new
// connection; one still failing so has no class and is retryable. When
// the request's deadline leaves no time for the dial, the cancelled ops'
// error is a timeout (ErrTimeout). A write
// of an Action set to InjectComplete returns nil once its bytes are in the
// socket: the owner's refusal, or a connection lost after that, is not
// reported to it (one posted to a connection already lost, or flushed
// before it was sent, fails as above). Over libfabric 2.0 to 2.6's shm,
// such a write of at most 192 bytes returns nil once posted: the owner's
// provider drops it, unreported, when the key is gone by the time it
// copies (Action.InjectComplete). A mem op that finds its link to a live
// owner ended before it copied (another op's request on the link failed,
// this manager verified the owner again, or the owner replaced its shm
// endpoint) moved nothing and is routed
// again within its request, twice at most and while the request's
// context and deadline last; one that still finds it so fails
// retryable, and the next op dials again. On efa
// only error numbers whose meaning is unambiguous have a class: an
// unreachable or unknown peer (prov_errno 13, 14, 15) is a setup or
// network problem, not a dead one.
package transport
