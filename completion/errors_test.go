package completion

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/fabric"
)

func TestErrorMessage(t *testing.T) {
	e := &Error{Op: Write, Provider: "tcp;ofi_rxm", Peer: "fi_sockaddr_in://10.0.0.2:5000", Offset: 8 << 20, Len: 1 << 20,
		Errno: fabric.ErrCanceled, ProvErrno: 2, ProvMessage: "No such file or directory", Hint: Hint("tcp;ofi_rxm", fabric.ErrCanceled, 2)}
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
}
