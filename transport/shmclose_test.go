package transport_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestClosingMidWriteLeavesTheOwnerAlive: a peer that closes its manager
// 1 ms into a 32 MiB shm write to an idle owner leaves the owner
// running and serving. On libfabric 1.17 the owner process crashed in
// about half of such closes (a new user's review): the peer's endpoint
// unlinked its region before the owner had mapped it, and the owner's
// progress then read the missing region for the peer's queued command.
// A closing 1.x shm endpoint now waits for the peers it sent to to map
// its region first.
func TestClosingMidWriteLeavesTheOwnerAlive(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	const size = 32 << 20
	for i := 0; i < 8; i++ {
		owner := testpeer.Start(t, testenv.RouteSHM)
		h := owner.Register(size, mr.ReadWrite, 0)
		m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteSHM), transport.WithTimeout(5*time.Second))
		require.NoError(t, err)
		local, err := m.Alloc(size, 0)
		require.NoError(t, err)
		wrote := make(chan error, 1)
		go func() { wrote <- m.WriteFrom(context.Background(), h, local) }()
		time.Sleep(time.Millisecond) // the fault's timing, not a readiness signal: the close lands in the write
		require.NoError(t, m.Close())
		<-wrote // nil or ErrClosed: either is the close's to decide

		// The owner serves a new peer over shm, which its progress must
		// run for: it would have crashed there.
		m2, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteSHM), transport.WithTimeout(5*time.Second))
		require.NoError(t, err)
		b := register(t, m2, alloc(t, 4096), mr.ReadWrite)
		head, err := h.Slice(0, 4096)
		require.NoError(t, err)
		require.NoError(t, m2.ReadInto(context.Background(), b, head), "attempt %d: the owner no longer serves", i)
		require.NoError(t, m2.Close())
		owner.Stats() // fails the test if the owner exited
		owner.Close()
	}
}
