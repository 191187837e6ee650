package progress

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
)

func TestErrorMessage(t *testing.T) {
	e := &Error{Op: Write, Provider: "tcp;ofi_rxm", Peer: "fi_sockaddr_in://10.0.0.2:5000", Offset: 8 << 20, Len: 1 << 20,
		Errno: fabric.ErrCanceled, ProvErrno: 2, ProvMessage: "No such file or directory", Hint: fabric.Hint("tcp;ofi_rxm", fabric.ErrCanceled, 2)}
	msg := e.Error()
	for _, want := range []string{"write", "1048576 bytes at offset 8388608", "fi_sockaddr_in://10.0.0.2:5000",
		"tcp;ofi_rxm", "Operation canceled (FI_ECANCELED 125)", "provider error 2: No such file or directory", "rejects its key"} {
		assert.Contains(t, msg, want)
	}
	assert.True(t, errors.Is(e, fabric.ErrCanceled))
	assert.True(t, IsCancellation(e))
}

func TestTimeoutError(t *testing.T) {
	e := &TimeoutError{Op: Read, Provider: "shm", Peer: "fi_shm://42:0:0", Bytes: 1 << 20, After: 2 * time.Second,
		Completed: 3, Total: 8, Cause: context.DeadlineExceeded}
	assert.Contains(t, e.Error(), "timed out after 2s: 3 of 8 chunks completed")
	assert.Contains(t, e.Error(), "shm also never answers")
	assert.True(t, errors.Is(e, context.DeadlineExceeded))
	e.Cause = context.Canceled
	assert.Contains(t, e.Error(), "was canceled")
	assert.NotContains(t, e.Error(), "the peer may be", "a cancel is the caller's")

	// Routes where this process copies alone do not blame the peer.
	for _, provider := range []string{"mem", "cma"} {
		e := &TimeoutError{Op: Write, Provider: provider, Peer: "process 42", Bytes: 1 << 20, After: time.Millisecond,
			Completed: 1, Total: 2, Cause: context.DeadlineExceeded}
		assert.NotContains(t, e.Error(), "the peer may be", provider)
		assert.Contains(t, e.Error(), "the deadline was shorter than the copy", provider)
	}
}

// TestErrorClasses: the provider's numbers map to the classes of the
// error vocabulary only where their documented meaning is unambiguous,
// and errors.Is sees the class through the typed error.
func TestErrorClasses(t *testing.T) {
	tests := []struct {
		name      string
		e         *Error
		class     error // nil: none
		transient bool
	}{
		{"tcp: key rejected", &Error{Provider: "tcp;ofi_rxm", Errno: fabric.ErrKeyRejected}, errclass.ErrStaleHandle, false},
		{"any: access", &Error{Provider: "shm", Errno: fabric.ErrAccess}, errclass.ErrAccessDenied, false},
		{"any: truncated", &Error{Provider: "shm", Errno: fabric.ErrTrunc}, errclass.ErrOutOfRange, false},
		{"any: provider timeout", &Error{Provider: "tcp;ofi_rxm", Errno: fabric.ErrTimedOut}, errclass.ErrTimeout, true},
		{"any: busy", &Error{Provider: "shm", Errno: fabric.ErrAgain, Posting: true}, nil, true},
		// A lost connection says nothing about the peer by itself: rxm
		// reports it to a live owner that closed it after a refused op.
		{"tcp 2.x: not connected", &Error{Provider: "tcp;ofi_rxm", Errno: fabric.ErrNotConn}, nil, true},
		// A flushed op: tcp's prov_errno is a leftover errno, no cause.
		{"tcp 1.17: canceled, EPIPE", &Error{Provider: "tcp;ofi_rxm", Errno: fabric.ErrCanceled, ProvErrno: 32}, nil, false},
		{"tcp 1.17: canceled, ENOENT", &Error{Provider: "tcp;ofi_rxm", Errno: fabric.ErrCanceled, ProvErrno: 2}, nil, false},
		{"any: I/O error", &Error{Provider: "shm", Errno: fabric.ErrIO}, nil, false},
		{"efa 1.17: bad address", &Error{Provider: "efa", Errno: fabric.ErrIO, ProvErrno: 7}, errclass.ErrStaleHandle, false},
		{"efa 1.22: bad address", &Error{Provider: "efa", Errno: fabric.ErrInval, ProvErrno: 7}, errclass.ErrStaleHandle, false},
		{"efa: bad destination QP", &Error{Provider: "efa", Errno: fabric.ErrNotConn, ProvErrno: 9}, errclass.ErrPeerGone, false},
		{"efa: established peer stopped answering", &Error{Provider: "efa", Errno: fabric.ErrConnAborted, ProvErrno: 4124}, errclass.ErrPeerGone, false},
		{"efa: remote buffer too short", &Error{Provider: "efa", Errno: fabric.ErrMsgSize, ProvErrno: 11}, errclass.ErrOutOfRange, false},
		{"efa: receiver not ready", &Error{Provider: "efa", Errno: fabric.ErrNoRx, ProvErrno: 10}, nil, true},
		{"efa: bad remote status", &Error{Provider: "efa", Errno: fabric.ErrRemoteIO, ProvErrno: 12}, nil, true},
		// Documented, but not one class: unknown peer is the target's
		// setup, unreachable the network's, unresponsive either.
		{"efa: unknown peer", &Error{Provider: "efa", Errno: fabric.ErrNotConn, ProvErrno: 14}, nil, false},
		{"efa: unreachable", &Error{Provider: "efa", Errno: fabric.ErrHostUnreach, ProvErrno: 15}, nil, false},
		{"efa: unresponsive", &Error{Provider: "efa", Errno: fabric.ErrConnAborted, ProvErrno: 13}, nil, false},
		{"efa: aborted (probably exited)", &Error{Provider: "efa", Errno: fabric.ErrConnAborted, ProvErrno: 8}, nil, false},
		{"efa: flushed", &Error{Provider: "efa", Errno: fabric.ErrCanceled, ProvErrno: 1}, nil, false},
	}
	all := []error{errclass.ErrPeerGone, errclass.ErrStaleHandle, errclass.ErrAccessDenied, errclass.ErrOutOfRange, errclass.ErrTimeout}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.class, tt.e.Class())
			assert.Equal(t, tt.transient, tt.e.Transient())
			for _, c := range all {
				wrapped := fmt.Errorf("chunk: %w", tt.e)
				assert.Equal(t, c == tt.class, errors.Is(wrapped, c), "errors.Is(%v)", c)
			}
			assert.True(t, errors.Is(tt.e, tt.e.Errno), "the errno stays underneath")
		})
	}
}

func TestTimeoutAndPeerGoneClasses(t *testing.T) {
	deadline := &TimeoutError{Op: Read, Cause: context.DeadlineExceeded}
	assert.ErrorIs(t, deadline, errclass.ErrTimeout)
	assert.ErrorIs(t, deadline, context.DeadlineExceeded)
	canceled := &TimeoutError{Op: Read, Cause: context.Canceled}
	assert.NotErrorIs(t, canceled, errclass.ErrTimeout, "a canceled context is not a timeout")
	assert.ErrorIs(t, canceled, context.Canceled)
	gone := &PeerGoneError{Op: Write, Provider: "cma", Peer: "process 1", Cause: "process 1 no longer exists"}
	assert.ErrorIs(t, gone, errclass.ErrPeerGone)
	assert.NotErrorIs(t, gone, errclass.ErrTimeout)
	assert.Equal(t, "not started: the deadline had passed (context deadline exceeded)",
		(&TimeoutError{Cause: context.DeadlineExceeded, NotStarted: true}).Error())
	assert.Equal(t, "not started: the context was canceled", (&TimeoutError{Cause: context.Canceled, NotStarted: true}).Error())
}
