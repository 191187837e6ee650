package memcpy

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/progress"
)

func TestCopy(t *testing.T) {
	lim := route.Limit{Ctx: context.Background(), Start: time.Now(), Deadline: time.Now().Add(time.Minute)}
	target := make([]byte, 3*route.Piece+5)
	for i := range target {
		target[i] = byte(i)
	}
	local := make([]byte, len(target))
	require.NoError(t, Copy(lim, progress.Read, local, target))
	assert.Equal(t, target, local)
	clear(target)
	require.NoError(t, Copy(lim, progress.Write, local[:10], target[:10]))
	assert.Equal(t, local[:10], target[:10])
}

// TestCopyLimit: a copy longer than a piece stops at the limit between
// pieces; the first piece always moves, so that an op shorter than a
// piece is never cut.
func TestCopyLimit(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	lim := route.Limit{Ctx: ctx, Start: time.Now(), Deadline: time.Now().Add(time.Minute)}
	target := make([]byte, 2*route.Piece)
	target[0], target[route.Piece] = 1, 2
	local := make([]byte, len(target))
	err := Copy(lim, progress.Read, local, target)
	var te *progress.TimeoutError
	require.ErrorAs(t, err, &te)
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, 1, te.Completed)
	assert.Equal(t, 2, te.Total)
	assert.Equal(t, byte(1), local[0])
	assert.Zero(t, local[route.Piece], "the second piece did not move")
}
