package transport_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

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
