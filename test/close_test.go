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

// TestCloseWithOpsInFlight: a transfer times out against an owner that
// does not progress, leaving ops in flight in libfabric; then the buffer
// and the manager are closed. The buffer's Close must not report the
// memory free while those ops may still use it (it waits the manager's
// timeout, then returns an *InUseError); the manager's Close must return
// nil (no endpoint is stuck inside libfabric), without crashing the
// process; and a new manager works with the owner once it runs again.
// Where the transfer completes with the owner stopped, or times out in
// its handle check before any op used the buffer, nothing is in flight
// and the buffer's Close returns nil.
func TestCloseWithOpsInFlight(t *testing.T) {
	const timeout = time.Second
	for _, prov := range providers {
		for _, op := range []string{"read", "write"} {
			t.Run(prov+"/"+op, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				want := expect(t, prov).stoppedBig
				owner := testpeer.Start(t, prov)
				h := owner.Register(big, mr.ReadWrite, 3)
				m, err := transport.New(context.Background(), transport.WithProviders(prov), transport.WithTimeout(timeout))
				require.NoError(t, err)
				mem, err := mr.Alloc(big)
				require.NoError(t, err)
				defer mr.Free(mem)
				defer m.Close() // before the memory goes, whatever happens
				local, err := m.Register(mem, mr.ReadWrite)
				require.NoError(t, err)
				setup, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				require.NoError(t, transfer(setup, m, op, local, h)) // connected

				owner.Stop()
				// A deadline of its own, so that a route that needs no
				// owner has the time to copy 64 MiB on a busy machine;
				// the buffer's Close waits the manager's timeout.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				xferErr := transfer(ctx, m, op, local, h)
				t.Logf("with the owner stopped: %v", xferErr)
				start := time.Now()
				err = local.Close()
				switch want {
				case completes:
					require.NoError(t, xferErr, "%s needs no owner progress", prov)
					require.NoError(t, err, "nothing in flight")
				case checkTimesOut:
					var te *transport.TransferError
					require.ErrorAs(t, xferErr, &te)
					require.Equal(t, "handle check", te.Op, "%v", xferErr)
					require.ErrorIs(t, xferErr, transport.ErrTimeout)
					require.NoError(t, err, "no op used the buffer")
				case opsTimeOut:
					var te *transport.TransferError
					require.ErrorAs(t, xferErr, &te)
					require.Equal(t, op, te.Op, "%v", xferErr)
					require.ErrorIs(t, xferErr, transport.ErrTimeout)
					var inUse *transport.InUseError
					require.ErrorAs(t, err, &inUse, "ops of the timed-out transfer are still in flight")
					assert.Equal(t, 1, inUse.Transfers)
					assert.Equal(t, timeout, inUse.Waited)
					assert.Contains(t, err.Error(), "do not free or reuse the memory")
					t.Logf("buffer Close: %v", err)
				}
				closeErr := m.Close()
				t.Logf("Close after %v: %v", time.Since(start).Round(time.Millisecond), closeErr)
				assert.NoError(t, closeErr, "no endpoint is stuck inside libfabric")
				assert.Less(t, time.Since(start), 15*time.Second)
				owner.Continue()

				m2, err := transport.New(context.Background(), transport.WithProviders(prov))
				require.NoError(t, err)
				defer m2.Close()
				l2, err := m2.Register(mem[:4096], mr.ReadWrite)
				require.NoError(t, err)
				small, _ := h.Slice(0, 4096)
				require.NoError(t, transfer(setup, m2, op, l2, small), "a new manager works with the owner")
				require.NoError(t, m2.Close())
			})
		}
	}
}
