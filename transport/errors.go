package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/progress"
)

// The error vocabulary: whatever the route (memcpy, cma, shm, tcp;ofi_rxm,
// efa), errors.Is answers these five for a failed transfer, and the
// provider's *progress.Error, when there is one, stays underneath for
// errors.As. The package documentation has the table of which case gives
// which class on which route.
var (
	// ErrPeerGone: the buffer's owner process exited (a zombie counts) or
	// nothing listens at its endpoint any more; retrying cannot help.
	ErrPeerGone = errclass.ErrPeerGone
	// ErrStaleHandle: the owner no longer has the buffer the handle names
	// (closed, or the owner restarted), or the handle was altered. Where
	// the owner's provider checks keys (tcp;ofi_rxm, efa), any key, range
	// or access mismatch it refuses is reported as this: it does not say
	// which. On tcp;ofi_rxm the owner refuses an op by dropping the
	// connection, and the ops of other requests in flight on it then
	// fail so too, their handles valid or not: a request that shares a
	// manager and owner with another's stale handle may retry once before
	// it takes its own handle for stale.
	ErrStaleHandle = errclass.ErrStaleHandle
	// ErrAccessDenied: the owner did not grant the remote right the op needs.
	ErrAccessDenied = errclass.ErrAccessDenied
	// ErrOutOfRange: a slice or handle range outside its buffer.
	ErrOutOfRange = errclass.ErrOutOfRange
	// ErrTimeout: the deadline (the context's, or the manager's timeout)
	// passed first, or the provider timed the op out. For a deadline
	// errors.Is(err, context.DeadlineExceeded) holds as well; a canceled
	// context is context.Canceled, not ErrTimeout.
	ErrTimeout = errclass.ErrTimeout
)

// Errors for bad input and state; each returned error wraps one and says
// what was wrong.
var (
	// ErrClosed: the manager is closed.
	ErrClosed = errors.New("manager closed")
	// ErrBufferClosed: the local buffer was closed. A remote buffer its
	// owner closed is ErrStaleHandle.
	ErrBufferClosed = errors.New("buffer closed")
	// ErrTooSmall: the destination of a transfer is smaller than its source.
	ErrTooSmall = errors.New("destination too small")
	// ErrNoRoute: no backend reaches the buffer's owner from here.
	ErrNoRoute = errors.New("no route to the buffer's owner")
	// ErrForeignBuffer: a local buffer of another manager.
	ErrForeignBuffer = errors.New("buffer belongs to another manager")
	// ErrConflict: ops of one Action touch overlapping local memory.
	ErrConflict = errors.New("conflicting ops in one action")
	// ErrDeviceMemory: device memory where it cannot be used, or a manager
	// not opened WithDeviceMemory.
	ErrDeviceMemory = errors.New("device memory not supported here")
	// ErrEndpointBlocked: an shm endpoint that can complete no more ops,
	// because ops to a peer that died are still in flight on it
	// (libfabric.Route.Blocked), or that may take no more peers. On
	// libfabric 2.x the manager's next request goes out on a new shm
	// endpoint, and Retryable reports true; on 1.x the manager must be
	// closed and a new one opened, and Retryable reports false.
	ErrEndpointBlocked = errclass.ErrBlocked
	// ErrEndpointWedged: an endpoint stuck inside a libfabric call that
	// does not return (a *progress.WedgedError); ops on it fail with it,
	// and Manager.Close reports it, leaving that endpoint and its memory
	// behind rather than freeing them under the stuck call. A stuck shm
	// endpoint is replaced, and later requests go out on a new one; but
	// ops toward an owner endpoint whose region lock a dead process holds
	// may wedge that one too, each wedge leaving a thread spinning. So
	// Retryable reports false.
	ErrEndpointWedged = errclass.ErrWedged
)

// TransferError is a transfer (or an Action) that failed. It keeps every
// error — one per failed chunk or op, a *progress.TimeoutError when the
// deadline passed — and leads with the first that is not a cancellation.
// errors.Is and errors.As see all of them.
type TransferError struct {
	Op           string // "read", "write", "action", or "handle check" (it failed before any op of the request)
	Bytes        uint64
	Ops          int // ops (transfers) in the request
	Chunks       int // RMA ops they were split into
	Failed       int // chunks or ops that failed
	NotAttempted int // chunks never posted: an earlier one failed, or the request ended first (its deadline, say)
	Errs         []error
}

func (e *TransferError) Error() string {
	lead := e.Errs[0]
	for _, err := range e.Errs {
		if !progress.IsCancellation(err) {
			lead = err
			break
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s of %d bytes failed: %v", e.Op, e.Bytes, lead)
	if n := len(e.Errs) - 1; n > 0 {
		fmt.Fprintf(&b, " (and %d more error%s)", n, plural(n))
	}
	if e.NotAttempted > 0 {
		fmt.Fprintf(&b, "; %d of %d chunks never posted", e.NotAttempted, e.Chunks)
	}
	return b.String()
}

// Unwrap returns every error.
func (e *TransferError) Unwrap() []error { return e.Errs }

// final are the errors that retrying the same request cannot cure.
var final = []error{ErrPeerGone, ErrStaleHandle, ErrAccessDenied, ErrOutOfRange, context.Canceled,
	ErrClosed, progress.ErrClosed, ErrBufferClosed, ErrTooSmall, ErrNoRoute, ErrForeignBuffer, ErrConflict,
	ErrDeviceMemory, ErrBadHandle}

// Retryable reports whether the same request may succeed if made again:
// err is (or holds) a timeout (ErrTimeout), or a transient provider error
// — the provider was busy (FI_EAGAIN), or a connection to a peer that
// still listens dropped — or a mem op whose link to a live owner ended
// before it copied, again after its request routed it anew (nothing
// moved; the next op dials again), or a blocked shm endpoint that the
// next request leaves for a new one (libfabric 2.x), and nothing in it
// says a retry cannot help: a peer gone, a stale or altered handle,
// access denied, out of range, a canceled context, a closed manager or
// buffer, bad input, an endpoint blocked for the manager's life (1.x), a
// wedged endpoint. Errors it does not know (FI_EIO, say) are not
// retryable: retrying blindly could repeat a failure forever.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	for _, f := range final {
		if errors.Is(err, f) {
			return false
		}
	}
	var wedged *progress.WedgedError
	if errors.As(err, &wedged) {
		return false
	}
	// A blocked endpoint that the next request leaves for a new one says
	// so (errclass.ErrRouteReplaced); one that stays is final. One
	// manager's endpoints are all of one libfabric, so one request's
	// blocked errors are all of one kind.
	replaced := errors.Is(err, errclass.ErrRouteReplaced)
	if errors.Is(err, ErrEndpointBlocked) && !replaced {
		return false
	}
	return replaced || errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || transient(err) || linkEnded(err)
}

// transient reports whether err or any error it wraps is a
// *progress.Error that says the op may succeed if tried again.
func transient(err error) bool {
	if ce, ok := err.(*progress.Error); ok && ce.Transient() {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		if next := u.Unwrap(); next != nil {
			return transient(next)
		}
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if transient(e) {
				return true
			}
		}
	}
	return false
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// InUseError is a Buffer.Close that returned with transfers whose ops are
// still with the provider: the memory is still in use. Stuck of them may
// never complete (their shm peer died, or their endpoint is blocked);
// Close waited Waited for the others.
type InUseError struct {
	Buffer    uint64
	Transfers int
	Stuck     int
	// Peers are the processes whose marked ops (mem, cma, shm) on the
	// buffer were not yet over when Close stopped waiting for them: they,
	// or on libfabric 2.x shm this process's provider for them, may still
	// copy with the memory.
	Peers  []int
	Waited time.Duration
}

func (e *InUseError) Error() string {
	if len(e.Peers) > 0 {
		return fmt.Sprintf("buffer %d: process(es) %v still copy with its memory after %v (mem, cma or shm); "+
			"a peer's op may still write it: do not reuse or free it (a Manager.Alloc buffer's is kept)", e.Buffer, e.Peers, e.Waited)
	}
	why := fmt.Sprintf("still have ops in flight after %v", e.Waited)
	if e.Waited == 0 {
		why = "still have ops in flight that may never complete (their peer died or their endpoint is blocked)"
	}
	return fmt.Sprintf("buffer %d: %d transfer(s) %s; the registration stays until they complete, "+
		"so do not free or reuse the memory before its Released is closed (Manager.Close closes it too)", e.Buffer, e.Transfers, why)
}
