package test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// allRoutes are every route: memcpy (the owner is the test's own
// manager), then the providers a child owner and the test force on both
// ends.
var allRoutes = append([]string{"memcpy"}, providers...)

const tcp = testenv.RouteTCP

// requireRoutes needs the routes of want on this machine: a missing one
// skips the test, or fails it under CI=true (testenv.RequireRoute).
func requireRoutes(t *testing.T, want ...string) {
	t.Helper()
	for _, r := range want {
		testenv.RequireRoute(t, r)
	}
}

// TestDeadlineEndsLongTransfer: on every route, a transfer far longer
// than its deadline — the context's, or the manager's timeout when the
// context has none — ends with ErrTimeout (and context.DeadlineExceeded)
// within the deadline plus a second. The bound is for correctness, not
// speed: 256 MiB cannot move in 20 ms on any route here.
func TestDeadlineEndsLongTransfer(t *testing.T) {
	requireRoutes(t, "memcpy", "cma", "shm", tcp)
	const (
		n        = 256 << 20
		deadline = 20 * time.Millisecond
	)
	for _, route := range allRoutes {
		t.Run(route, func(t *testing.T) {
			var peer *testpeer.Peer
			if route != "memcpy" {
				peer = testpeer.Start(t, route)
			}
			for _, how := range []string{"context deadline", "manager timeout"} {
				t.Run(how, func(t *testing.T) {
					// The memory outlives the manager (cleanups run last
					// first): ops a timed-out transfer left with the
					// provider may use it until the manager closes.
					mem, err := mr.Alloc(n)
					require.NoError(t, err)
					t.Cleanup(func() { _ = mr.Free(mem) })
					opts := []transport.Option{transport.WithTimeout(time.Minute)}
					if route != "memcpy" {
						opts = append(opts, transport.WithProviders(route))
					}
					if how == "manager timeout" {
						opts = append(opts, transport.WithTimeout(deadline))
					}
					m := newManager(t, opts...)
					local, err := m.Register(mem, mr.ReadWrite)
					require.NoError(t, err)
					var remote transport.RemoteBuffer
					if peer != nil {
						remote = peer.Register(n, mr.ReadWrite, 1)
					} else {
						rmem, err := mr.Alloc(n)
						require.NoError(t, err)
						t.Cleanup(func() { _ = mr.Free(rmem) })
						rb, err := m.Register(rmem, mr.ReadWrite)
						require.NoError(t, err)
						remote = rb.Remote()
					}
					for _, op := range []string{"read", "write"} {
						ctx := context.Background()
						if how == "context deadline" {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, deadline)
							defer cancel()
						}
						start := time.Now()
						err := transfer(ctx, m, op, local, remote)
						took := time.Since(start)
						t.Logf("%s after %v: %v", op, took.Round(time.Millisecond), err)
						assert.ErrorIs(t, err, transport.ErrTimeout, "%s", op)
						assert.ErrorIs(t, err, context.DeadlineExceeded, "%s", op)
						assert.Less(t, took, deadline+time.Second, "%s: the deadline was not honoured", op)
					}
				})
			}
		})
	}
}
