package libfabric

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/progress"
)

// TestScratchSlotWaitIsATimeout: a handle check that finds every scratch
// slot taken (checks toward a stopped owner hold theirs until their jobs
// settle) fails at the request's deadline, or at its context's end, as a
// *progress.TimeoutError saying what it waited for, which transport
// reports as a timeout before anything moved. It was a bare error outside
// the vocabulary (from a data-path review).
func TestScratchSlotWaitIsATimeout(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		s := &Scratch{slots: make(chan uint32, 1), entrySize: 64} // its one slot taken
		ctx, deadline, want := context.Background(), time.Now().Add(10*time.Millisecond), context.DeadlineExceeded
		if cancelled {
			c, cancel := context.WithCancel(ctx)
			time.AfterFunc(10*time.Millisecond, cancel)
			ctx, deadline, want = c, time.Now().Add(time.Hour), context.Canceled
		}
		_, err := s.get(ctx, deadline)
		var te *progress.TimeoutError
		require.ErrorAs(t, err, &te)
		assert.Contains(t, te.Awaiting, "free slot for its handle check")
		assert.ErrorIs(t, err, want)
		assert.Equal(t, !cancelled, errors.Is(err, errclass.ErrTimeout), "a deadline is a timeout, a cancel is not")
	}
}
