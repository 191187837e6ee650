package transport_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestNoAllocsPerOp: once a route is warmed up (peer verified and
// inserted, pools filled), a synchronous ReadInto or WriteFrom, and a
// window of ops submitted as one Action, allocate nothing, on every route
// to a peer process (issue 16).
func TestNoAllocsPerOp(t *testing.T) {
	if testenv.RaceEnabled {
		t.Skip("the race detector allocates for its own bookkeeping")
	}
	const size, window, runs = 4 << 10, 16, 200
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			remote := peer.Register(size, mr.ReadWrite, 1)
			local := register(t, m, alloc(t, size), 0)
			small, err := local.Slice(0, 8)
			require.NoError(t, err)
			smallRemote, err := remote.Slice(0, 8)
			require.NoError(t, err)
			ctx := context.Background()
			a := m.NewAction().AllowOverlap()
			cases := []struct {
				name string
				run  func() error
			}{
				{"ReadInto/8", func() error { return m.ReadInto(ctx, small, smallRemote) }},
				{"WriteFrom/8", func() error { return m.WriteFrom(ctx, smallRemote, small) }},
				{"ReadInto/4096", func() error { return m.ReadInto(ctx, local, remote) }},
				{"WriteFrom/4096", func() error { return m.WriteFrom(ctx, remote, local) }},
				{"Action/16", func() error {
					a.Reset()
					for k := 0; k < window; k++ {
						a.ReadInto(small, smallRemote)
						a.WriteFrom(smallRemote, small)
					}
					return a.Submit(ctx)
				}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					for i := 0; i < 10; i++ { // connect, verify, fill the pools
						require.NoError(t, c.run())
					}
					var failed error
					allocs := testing.AllocsPerRun(runs, func() {
						if err := c.run(); err != nil && failed == nil {
							failed = err
						}
					})
					require.NoError(t, failed)
					if allocs != 0 {
						t.Errorf("%v allocations per op on %s, want 0", allocs, prov)
					}
				})
			}
		})
	}
}
