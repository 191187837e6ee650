package completion

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
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

// IsCancellation reports whether err is a flushed or canceled op
// (FI_ECANCELED): the consequence of another failure, not a cause.
func IsCancellation(err error) bool { return errors.Is(err, fabric.ErrCanceled) }

// TimeoutError is a transfer that did not finish before its deadline (or
// whose context was canceled). errors.Is(err, context.DeadlineExceeded)
// (or context.Canceled) holds.
type TimeoutError struct {
	Op        Op
	Provider  string
	Peer      string
	Bytes     uint64
	After     time.Duration
	Completed int // chunks that completed
	Total     int // chunks in the transfer
	Cause     error
}

func (e *TimeoutError) Error() string {
	verb := "timed out"
	if errors.Is(e.Cause, context.Canceled) {
		verb = "was canceled"
	}
	return fmt.Sprintf("%s of %d bytes with %s over %s %s after %v: %d of %d chunks completed; "+
		"the peer may be dead, stopped, unreachable or not progressing its endpoint%s",
		e.Op, e.Bytes, e.Peer, e.Provider, verb, e.After.Round(time.Millisecond), e.Completed, e.Total, shmNote(e.Provider))
}

func shmNote(provider string) string {
	if provider == "shm" {
		return " (shm also never answers a request for a closed or unknown buffer)"
	}
	return ""
}

// Unwrap exposes the context error.
func (e *TimeoutError) Unwrap() error { return e.Cause }

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
