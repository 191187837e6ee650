package transport

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/completion"
)

// Errors for bad input and state; each returned error wraps one and says
// what was wrong.
var (
	// ErrClosed: the manager is closed.
	ErrClosed = errors.New("manager closed")
	// ErrBufferClosed: the local buffer was closed, or the remote one was
	// closed by its owner.
	ErrBufferClosed = errors.New("buffer closed")
	// ErrTooSmall: the destination of a transfer is smaller than its source.
	ErrTooSmall = errors.New("destination too small")
	// ErrOutOfRange: a slice or handle range outside its buffer.
	ErrOutOfRange = errors.New("out of range")
	// ErrAccessDenied: the owner did not grant the remote right the op needs.
	ErrAccessDenied = errors.New("access denied")
	// ErrNoRoute: no backend reaches the buffer's owner from here.
	ErrNoRoute = errors.New("no route to the buffer's owner")
	// ErrForeignBuffer: a local buffer of another manager.
	ErrForeignBuffer = errors.New("buffer belongs to another manager")
	// ErrConflict: ops of one Action touch overlapping local memory.
	ErrConflict = errors.New("conflicting ops in one action")
	// ErrStaleHandle: the owner no longer has the buffer the handle names
	// (closed, or the owner restarted), or the handle was altered.
	ErrStaleHandle = errors.New("stale or altered handle")
	// ErrDeviceMemory: device memory where it cannot be used, or a manager
	// not opened WithDeviceMemory.
	ErrDeviceMemory = errors.New("device memory not supported here")
	// ErrEndpointBlocked: an shm endpoint that can complete no more ops,
	// because ops to a peer that died are still in flight on it (see
	// backend.blocked).
	ErrEndpointBlocked = errors.New("endpoint blocked")
	// ErrPeerGone: the buffer's owner exited or closed its manager.
	ErrPeerGone = errors.New("peer gone")
)

// TransferError is a transfer (or an Action) that failed. It keeps every
// error — one per failed chunk or op, a *completion.TimeoutError when the
// deadline passed — and leads with the first that is not a cancellation.
// errors.Is and errors.As see all of them.
type TransferError struct {
	Op           string // "read", "write", "action", or "handle check" (it failed before any op of the request)
	Bytes        uint64
	Ops          int // ops (transfers) in the request
	Chunks       int // RMA ops they were split into
	Failed       int // chunks or ops that failed
	NotAttempted int // chunks not posted because an earlier one failed
	Errs         []error
}

func (e *TransferError) Error() string {
	lead := e.Errs[0]
	for _, err := range e.Errs {
		if !completion.IsCancellation(err) {
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
		fmt.Fprintf(&b, "; %d of %d chunks not attempted after the failure", e.NotAttempted, e.Chunks)
	}
	return b.String()
}

// Unwrap returns every error.
func (e *TransferError) Unwrap() []error { return e.Errs }

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
	Waited    time.Duration
}

func (e *InUseError) Error() string {
	why := fmt.Sprintf("still have ops in flight after %v", e.Waited)
	if e.Waited == 0 {
		why = "still have ops in flight that may never complete (their peer died or their endpoint is blocked)"
	}
	return fmt.Sprintf("buffer %d: %d transfer(s) %s; the registration stays until they complete, "+
		"so do not free or reuse the memory before Manager.Close returns", e.Buffer, e.Transfers, why)
}
