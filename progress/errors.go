package progress

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
)

// Op is the kind of an RMA operation.
type Op int

// RMA operations.
const (
	Read Op = iota
	Write
)

func (o Op) String() string {
	if o == Write {
		return "write"
	}
	return "read"
}

// Error is one failed chunk, as its fi_cq_readerr entry (or a failed post)
// reported it. ProvMessage is fi_cq_strerror's text, copied when the entry
// was read.
type Error struct {
	Op          Op
	Provider    string
	Peer        string // the peer's endpoint address, printable
	Offset      uint64 // of the chunk within the transfer
	Len         uint64
	Errno       fabric.Errno // err of the completion entry
	ProvErrno   int          // provider-specific error number
	ProvMessage string       // fi_cq_strerror
	Posting     bool         // the post itself failed (no completion)
	Hint        string       // meaning and likely fix, when known
}

func (e *Error) Error() string {
	what := "completion error"
	if e.Posting {
		what = "post failed"
	}
	s := fmt.Sprintf("%s %s of %d bytes at offset %d with %s over %s: %s: %v",
		e.Op, what, e.Len, e.Offset, e.Peer, e.Provider, what, e.Errno)
	if e.ProvMessage != "" || e.ProvErrno != 0 {
		s += fmt.Sprintf(" (provider error %d: %s)", e.ProvErrno, e.ProvMessage)
	}
	if e.Hint != "" {
		s += "; " + e.Hint
	}
	return s
}

// Unwrap exposes the libfabric error number to errors.Is.
func (e *Error) Unwrap() error { return e.Errno }

// Is reports whether the error belongs to the class target, one of the
// transport package's ErrPeerGone, ErrStaleHandle, ErrAccessDenied,
// ErrOutOfRange or ErrTimeout (see Class).
func (e *Error) Is(target error) bool {
	c, _ := classify(e.Provider, e.Errno, e.ProvErrno)
	return c != nil && c == target
}

// Class is the class of the error in fitransfer's vocabulary (the
// transport package's ErrPeerGone, ErrStaleHandle, ErrAccessDenied,
// ErrOutOfRange or ErrTimeout), or nil when the numbers alone do not say.
// A lost connection, say, has no class here: whether its peer is gone
// takes a look at the peer, which the transport does.
func (e *Error) Class() error {
	c, _ := classify(e.Provider, e.Errno, e.ProvErrno)
	return c
}

// Transient reports whether the same op may succeed if tried again: the
// provider was busy or timed out, or the connection dropped (to a peer
// that may still be alive).
func (e *Error) Transient() bool {
	_, t := classify(e.Provider, e.Errno, e.ProvErrno)
	return t
}

// classify maps a provider's error report to its class and whether it is
// transient: the one place that reads meaning into error numbers. efa's
// prov_errno names the cause precisely (efa up to 1.21 reports every
// device error as FI_EIO), so a number the hint table documents decides
// alone; only codes whose documented meaning is unambiguous get a class.
func classify(provider string, errno fabric.Errno, provErrno int) (class error, transient bool) {
	if provider == "efa" && provErrno != 0 {
		switch provErrno {
		case 7: // REMOTE_ERROR_BAD_ADDRESS: key, range or access do not match the owner's registration
			return errclass.ErrStaleHandle, false
		case 9, 4124: // REMOTE_ERROR_BAD_DEST_QPN, ERR_ESTABLISHED_RECV_UNRESP: the peer's endpoint or process is gone
			return errclass.ErrPeerGone, false
		case 11: // REMOTE_ERROR_BAD_LENGTH: the remote buffer is shorter than the op
			return errclass.ErrOutOfRange, false
		case 10, 12: // REMOTE_ERROR_RNR, REMOTE_ERROR_BAD_STATUS: the table's fix is to retry
			return nil, true
		}
		if _, known := fabric.LookupHint(provider, 0, provErrno); known {
			return nil, false // documented, but not one of the classes (unreachable, unknown peer...)
		}
	}
	switch {
	case errno == fabric.ErrKeyRejected:
		return errclass.ErrStaleHandle, false
	case errno == fabric.ErrAccess:
		return errclass.ErrAccessDenied, false
	case errno == fabric.ErrTrunc:
		return errclass.ErrOutOfRange, false
	case errno == fabric.ErrTimedOut:
		return errclass.ErrTimeout, true
	case errno == fabric.ErrAgain, errno == fabric.Errno(4): // FI_EINTR
		return nil, true
	case fabric.ConnGone(errno):
		// tcp;ofi_rxm reports a lost connection this way to a live peer
		// too (after the owner refused an op, it closes the connection).
		// A cancellation (FI_ECANCELED) is not transient by itself, whatever
		// its prov_errno: tcp's is the progress thread's leftover errno
		// (tcpx_cq_report_error, v1.17.0; xnet_cq.c, v2.1.0).
		return nil, true
	}
	return nil, false
}

// IsCancellation reports whether err is a flushed or canceled op
// (FI_ECANCELED): the consequence of another failure, not a cause.
func IsCancellation(err error) bool { return errors.Is(err, fabric.ErrCanceled) }

// TimeoutError is a transfer that did not finish before its deadline (or
// whose context was canceled). errors.Is(err, context.DeadlineExceeded)
// and errors.Is(err, transport.ErrTimeout) hold for a deadline,
// errors.Is(err, context.Canceled) for a cancellation.
type TimeoutError struct {
	Op        Op
	Provider  string
	Peer      string
	Bytes     uint64
	After     time.Duration
	Completed int // chunks that completed
	Total     int // chunks in the transfer
	Cause     error
	// NotStarted: the context was done before the transfer began, and
	// nothing moved. Only Cause is set then.
	NotStarted bool
	// Left: the endpoint was inside a libfabric call that had not
	// returned when the deadline came, or was closing (Closing), so the
	// job was left to its progress loop, which ends it when the call
	// returns or the close is done; until then its chunks in flight may
	// still move data. Completed is not known then (0).
	Left bool
	// Closing: Left because the endpoint was closing (its manager's
	// Close, or a rail's replacement), which ends the chunks in flight
	// once its drain (1.x tcp;ofi_rxm: up to 500 ms) and the endpoint's
	// close are done.
	Closing bool
	// Awaiting is what the request was waiting for when its deadline came
	// or its context ended, when that was not its chunks but an answer
	// it needs before it may post any (a same-node owner's verification,
	// say): nothing moved then, and Completed and Total are 0.
	Awaiting string
	// Busy: the request gave up before it could insert its peer's address
	// or register memory, because the endpoint was inside a libfabric call
	// (the progress loop's, or another op's) that had not returned.
	// Nothing moved; only Provider, After and Cause are set where it
	// arose, the op's fields by the caller.
	Busy bool
}

func (e *TimeoutError) Error() string {
	verb := "timed out"
	if errors.Is(e.Cause, context.Canceled) {
		verb = "was canceled"
	}
	if e.NotStarted {
		if verb == "timed out" {
			return "not started: the deadline had passed (" + e.Cause.Error() + ")"
		}
		return "not started: the context was canceled"
	}
	if e.Busy {
		return fmt.Sprintf("%s of %d bytes with %s over %s %s after %v waiting for the endpoint, inside a libfabric call that had not returned: "+
			"nothing moved; a call that never returns is reported as a wedged endpoint after the loop's WedgeAfter",
			e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond))
	}
	if e.Awaiting != "" {
		return fmt.Sprintf("%s of %d bytes with %s over %s %s after %v waiting for %s: nothing moved; the peer may be stopped, "+
			"overloaded or not serving its endpoint", e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond), e.Awaiting)
	}
	s := fmt.Sprintf("%s of %d bytes with %s over %s %s after %v: %d of %d chunks completed",
		e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond), e.Completed, e.Total)
	switch {
	case e.Left && e.Closing:
		s = fmt.Sprintf("%s of %d bytes with %s over %s %s after %v: the endpoint was closing, "+
			"and what of the transfer's %d chunks is in flight stays with it until its close is done",
			e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond), e.Total)
	case e.Left:
		s = fmt.Sprintf("%s of %d bytes with %s over %s %s after %v: the endpoint was inside a libfabric call that had not returned, "+
			"and the transfer's %d chunks stay with it until it does",
			e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond), e.Total)
	}
	switch {
	case verb != "timed out":
		return s // the caller's own cancel: nothing to blame on the peer
	case e.Provider == "memcpy", e.Provider == "mem", e.Provider == "cma":
		// This process copies alone (within itself, from its mapping of
		// the owner's memory, or with process_vm_readv/writev).
		return s + "; the copy needs nothing of the peer: the deadline was shorter than the copy"
	}
	return s + "; the peer may be dead, stopped, unreachable or not progressing its endpoint" + shmNote(e.Provider)
}

func shmNote(provider string) string {
	if provider == "shm" {
		return " (shm also never answers a request for a closed or unknown buffer)"
	}
	return ""
}

// Unwrap exposes the context error.
func (e *TimeoutError) Unwrap() error { return e.Cause }

// Is reports whether target is transport.ErrTimeout and the cause a
// deadline: a canceled context is context.Canceled only.
func (e *TimeoutError) Is(target error) bool {
	return target == errclass.ErrTimeout && !errors.Is(e.Cause, context.Canceled)
}

// ErrClosed is returned for jobs submitted to, or pending in, a loop that
// is closing.
var ErrClosed = errors.New("progress loop closed")

// PeerGoneError is a transfer stopped because its peer is known to be
// gone (its process exited), before the deadline.
type PeerGoneError struct {
	Op       Op
	Provider string
	Peer     string
	Cause    string // how it is known, e.g. "process 1234 no longer exists"
}

func (e *PeerGoneError) Error() string {
	return fmt.Sprintf("%s with %s over %s stopped: the peer is gone (%s)", e.Op, e.Peer, e.Provider, e.Cause)
}

// Is reports whether target is transport.ErrPeerGone.
func (e *PeerGoneError) Is(target error) bool { return target == errclass.ErrPeerGone }
