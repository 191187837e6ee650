package transport_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestNothingLandsAfterErrClosed: a ReadInto that Manager.Close fails
// with ErrClosed leaves its destination alone from then on. On 1.x's
// tcp;ofi_rxm, Close drains the endpoint (reaps, which moves data, for
// up to 500 ms) before closing it, and it used to fail the request as
// the shutdown began: about 1 MiB landed in the destination after the
// call returned (from a review; 4 of 4 runs on 1.17). The tail of the
// destination, where a stream's last bytes land, is copied first.
func TestNothingLandsAfterErrClosed(t *testing.T) {
	const size, tail = 64 << 20, 1 << 20
	testenv.RequireRoute(t, testenv.RouteTCP)
	owner := testpeer.Start(t, testenv.RouteTCP)
	h := owner.Register(size, mr.ReadWrite, 7)
	m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteTCP))
	require.NoError(t, err)
	mem := alloc(t, size)
	local := register(t, m, mem, mr.ReadWrite)
	require.NoError(t, m.ReadInto(context.Background(), local, h)) // connected

	snap := make([]byte, size)
	started := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		for {
			clear(mem)
			select {
			case started <- struct{}{}:
			default:
			}
			if err := m.ReadInto(context.Background(), local, h); err != nil {
				copy(snap[size-tail:], mem[size-tail:])
				copy(snap[:size-tail], mem[:size-tail])
				done <- err
				return
			}
		}
	}()
	<-started
	// Close once the read is landing (a 64 MiB read takes tens of
	// milliseconds here): its destination was cleared before it began.
	require.Eventually(t, func() bool { return slices.ContainsFunc(mem[:4096], func(b byte) bool { return b != 0 }) },
		10*time.Second, 10*time.Microsecond, "the read never began to land")
	require.NoError(t, m.Close())
	rerr := <-done
	require.True(t, errors.Is(rerr, transport.ErrClosed), "%v", rerr)
	changed, first := 0, -1
	for i := range mem {
		if mem[i] != snap[i] {
			if first < 0 {
				first = i
			}
			changed++
		}
	}
	require.Zero(t, changed, "%d bytes of the destination (first at offset %d) changed after ReadInto returned %v", changed, first, rerr)
}

// TestCloseStopsCopies: Manager.Close during a read that this process
// copies itself (mem, cma) returns only once the copy stopped, at its
// next piece, and the read let go of its buffers: nothing lands in the
// destination after Close returned, the read fails with ErrClosed (Close
// comes once its first bytes landed, well before a 128 MiB copy ends),
// and mr.Free takes the memory at once. Close
// returned within milliseconds while the copy went on: the read returned
// nil 80 ms later, 29,505 more pages of its destination were written
// after Close, and mr.Free refused the memory as still registered (a new
// user's review). Each route runs twice: once comparing the destination
// with what it held as Close returned, once freeing it at once.
func TestCloseStopsCopies(t *testing.T) {
	const size = 128 << 20
	for _, prov := range []string{testenv.RouteMem, testenv.RouteCMA} {
		for _, check := range []string{"bytes", "free"} {
			t.Run(prov+"/"+check, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				owner := testpeer.Start(t, prov)
				h := owner.Register(size, mr.ReadWrite, 7)
				m, err := transport.New(context.Background(), transport.WithProviders(prov))
				require.NoError(t, err)
				mem, err := mr.Alloc(size)
				require.NoError(t, err)
				local, err := m.Register(mem, mr.ReadWrite)
				require.NoError(t, err)
				read := make(chan error, 1)
				go func() { read <- m.ReadInto(context.Background(), local, h) }()
				require.Eventually(t, func() bool { return slices.ContainsFunc(mem[:4096], func(b byte) bool { return b != 0 }) },
					10*time.Second, 10*time.Microsecond, "the read never began to land")
				require.NoError(t, m.Close())
				if check == "free" {
					// Refused while the read holds the buffer: never
					// freed under a copy.
					require.NoError(t, mr.Free(mem), "the memory of a closed manager's buffer")
					require.ErrorIs(t, <-read, transport.ErrClosed)
					return
				}
				snap := bytes.Clone(mem)
				require.ErrorIs(t, <-read, transport.ErrClosed)
				assert.True(t, bytes.Equal(snap, mem), "the destination changed after Close returned")
				require.NoError(t, mr.Free(mem))
			})
		}
	}
}
