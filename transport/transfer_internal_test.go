package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route"
)

// TestCopiesOnly: a request reads no clock only when every op is a
// same-manager or mem copy of one piece at most; a longer copy, a cma op
// (which looks at its limit before its first chunk) or a fabric op needs
// the request's start and deadline.
func TestCopiesOnly(t *testing.T) {
	op := func(k route.Kind, n uint64) opSpec { return opSpec{kind: k, remote: RemoteBuffer{n: n}} }
	cases := []struct {
		name string
		ops  []opSpec
		want bool
	}{
		{"none", nil, true},
		{"mem, one piece", []opSpec{op(route.Mem, route.Piece)}, true},
		{"memcpy and mem", []opSpec{op(route.Memcpy, 8), op(route.Mem, 8)}, true},
		{"mem, a byte over a piece", []opSpec{op(route.Mem, route.Piece+1)}, false},
		{"memcpy, a byte over a piece", []opSpec{op(route.Memcpy, route.Piece+1)}, false},
		{"mem and cma", []opSpec{op(route.Mem, 8), op(route.CMA, 8)}, false},
		{"mem and fabric", []opSpec{op(route.Mem, 8), op(route.Fabric, 8)}, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, copiesOnly(c.ops), c.name)
	}
}

// TestAwaitLeftIsBounded: a request waits for ops an earlier one left in
// flight on its buffer within its own limits, and not for ops left
// longer than leftPatience ago (taken for stuck: a peer that died after
// the deadline, a call that never returns), which would otherwise keep
// the buffer from every request for good (a review). The rails' probe
// buffer counts none.
func TestAwaitLeftIsBounded(t *testing.T) {
	st := &bufState{}
	st.AddLeft(1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := st.awaitLeft(&reqTimes{ctx: ctx, timeout: time.Minute})
	require.ErrorIs(t, err, context.DeadlineExceeded, "waited within the request's limits")

	st.leftAt.Store(time.Now().Add(-leftPatience).UnixNano())
	require.NoError(t, st.awaitLeft(&reqTimes{ctx: context.Background(), timeout: time.Minute}), "ops left long ago are not waited for")

	st.AddLeft(-1)
	require.Zero(t, st.left.Load())
	probe := &bufState{unguarded: true}
	probe.AddLeft(1)
	require.Zero(t, probe.left.Load())
}
