package transport_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// TestCloseWhileVerifying: Close, while a request or a Route waits for
// a stopped owner to answer its verification, ends that wait with
// ErrClosed and returns, however far the request's deadline is; a
// request made once Close began fails with ErrClosed at once.
func TestCloseWhileVerifying(t *testing.T) {
	for _, call := range []string{"ReadInto", "Route"} {
		t.Run(call, func(t *testing.T) {
			testenv.RequireRoute(t, testenv.RouteMem)
			m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteMem), transport.WithTimeout(time.Minute))
			require.NoError(t, err)
			owner := testpeer.Start(t, testenv.RouteMem)
			h := owner.Register(4096, mr.ReadWrite, 1)
			local := register(t, m, alloc(t, 4096), mr.ReadWrite)
			owner.Stop()
			defer owner.Continue()

			waited := make(chan error, 1)
			go func() {
				if call == "Route" {
					_, err := m.Route(h)
					waited <- err
					return
				}
				waited <- m.ReadInto(context.Background(), local, h)
			}()
			require.Eventually(t, func() bool { return transport.VerificationsUnderWay(m) > 0 },
				10*time.Second, time.Millisecond, "the verification never began")

			closed := make(chan error, 1)
			go func() { closed <- m.Close() }()
			select {
			case err = <-waited:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still waits for the stopped owner 10 s after Close began", call)
			}
			assert.ErrorIs(t, err, transport.ErrClosed, "%s", call)
			assert.NotErrorIs(t, err, transport.ErrTimeout)
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("Close hangs while a verification is under way")
			}
			assert.ErrorIs(t, m.ReadInto(context.Background(), local, h), transport.ErrClosed)
		})
	}
}

// TestCloseFailsTransfersWithErrClosed: transfers under way when the
// manager closes fail with ErrClosed on every route, whichever part of
// the manager ended them (its loops' pending jobs on shm and tcp), or
// succeed; a Route asked after Close fails with ErrClosed too.
func TestCloseFailsTransfersWithErrClosed(t *testing.T) {
	const size, workers = 16 << 20, 4
	for _, route := range testenv.Routes() {
		t.Run(route, func(t *testing.T) {
			testenv.RequireRoute(t, route)
			owner := testpeer.Start(t, route)
			h := owner.Register(size, mr.ReadWrite, 1)
			m, err := transport.New(context.Background(), transport.WithProviders(route))
			require.NoError(t, err)
			errs := make(chan error, workers)
			started := make(chan struct{}, workers)
			for w := 0; w < workers; w++ {
				local := register(t, m, alloc(t, size), mr.ReadWrite)
				go func() {
					for i := 0; ; i++ {
						err := m.ReadInto(context.Background(), local, h)
						if i == 0 {
							started <- struct{}{}
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			for w := 0; w < workers; w++ {
				select {
				case <-started:
				case <-time.After(30 * time.Second):
					t.Fatal("no transfer completed")
				}
			}
			require.NoError(t, m.Close())
			for w := 0; w < workers; w++ {
				select {
				case err := <-errs:
					assert.ErrorIs(t, err, transport.ErrClosed)
				case <-time.After(30 * time.Second):
					t.Fatal("a transfer still runs 30 s after Close")
				}
			}
			_, err = m.Route(h)
			assert.ErrorIs(t, err, transport.ErrClosed, "Route after Close")
		})
	}
}

// TestCloseAfterShmReplacement: a buffer registered before its manager's
// shm endpoint was retired and replaced closes its registration on the
// retired endpoint when that endpoint's calls return (Close is nil, the
// memory is freed); when a call there has not returned, Close says the
// registration stays (ErrEndpointWedged), and says it again when called
// again: nil would tell the caller to free the memory.
func TestCloseAfterShmReplacement(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	t.Run("retired endpoint idle", func(t *testing.T) {
		m := newManager(t, transport.WithProviders(testenv.RouteSHM))
		b, err := m.Alloc(4096, mr.ReadWrite)
		require.NoError(t, err)
		require.NoError(t, transport.ReplaceSameNode(m))
		require.NoError(t, b.Close())
		require.NoError(t, b.Close())
	})
	t.Run("retired endpoint in a call", func(t *testing.T) {
		m := newManager(t, transport.WithProviders(testenv.RouteSHM))
		b, err := m.Alloc(4096, mr.ReadWrite)
		require.NoError(t, err)
		release := make(chan struct{})
		defer close(release)
		transport.HoldEndpoint(m, release)
		require.NoError(t, transport.ReplaceSameNode(m))
		err = b.Close()
		require.ErrorIs(t, err, transport.ErrEndpointWedged)
		assert.Contains(t, err.Error(), "do not free or reuse the memory")
		assert.Equal(t, err, b.Close(), "a second Close says the same")
	})
}

// TestCloseWhileCheckingAHandle: Close, while a request waits for its
// handle check over shm (the owner's guard entry, read before any op of
// the request may go out) on an endpoint that does not serve it (inside a
// call that has not returned, as toward a stopped owner's shm on 2.x),
// ends that wait: the request fails with ErrClosed, not at its own
// deadline, which may be an hour away, and Close goes on.
func TestCloseWhileCheckingAHandle(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteSHM), transport.WithTimeout(time.Hour))
	require.NoError(t, err)
	transport.GuardOverShm(m)
	owner := testpeer.Start(t, testenv.RouteSHM)
	h := owner.Register(4096, mr.ReadWrite, 1)
	local := register(t, m, alloc(t, 4096), mr.ReadWrite)
	// The owner verified and its address inserted; the second buffer's
	// guard entry, in a slot not read yet, needs a check.
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, h))
	h2 := owner.Register(4096, mr.ReadWrite, 2)
	require.False(t, transport.EntryKept(m, h2))

	release := make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	defer let()
	transport.HoldOpsEndpoint(m, release)
	posted := transport.LoopPosted(m)
	waited := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	go func() { waited <- m.ReadInto(ctx, local, h2) }()
	// The check's job is in the loop's inbox, behind the held call, once
	// the request waits for it: nothing posts meanwhile, so wait for the
	// request to hold the manager (Close then waits for it).
	require.Eventually(t, func() bool { return transport.RequestsUnderWay(m) == 1 }, 10*time.Second, time.Millisecond)
	require.Equal(t, posted, transport.LoopPosted(m), "nothing was posted behind the held call")

	closed := make(chan error, 1)
	go func() { closed <- m.Close() }()
	select {
	case err = <-waited:
	case <-time.After(3 * time.Second): // the hold would end it at the wedge, after WedgeAfter (10 s)
		t.Fatal("the request still waits for its handle check 3 s after Close began")
	}
	assert.ErrorIs(t, err, transport.ErrClosed)
	assert.NotErrorIs(t, err, transport.ErrTimeout)
	assert.NotErrorIs(t, err, context.Canceled, "nobody canceled the request's context")
	assert.Contains(t, err.Error(), "handle check")
	let()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close hangs after the check ended")
	}
}

// TestRequestWaitsForTheEndpointSetWithinItsLimits: a request that needs
// a new shm endpoint for its own ops (libfabric 2.x: its current one took
// its share of names) while a registration holds the manager's endpoint
// set, waiting for an endpoint inside a libfabric call, gives up at its
// deadline with a timeout that says it waited for the endpoint and moved
// nothing, instead of waiting until the registration's call wedges
// (WedgeAfter, 10 s). On 1.x the request's insert of the new owner waits
// for that same endpoint, with the same outcome.
func TestRequestWaitsForTheEndpointSetWithinItsLimits(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	t.Cleanup(transport.SetShmMapBudget(2)) // the endpoint itself and one owner
	m := newManager(t, transport.WithProviders(testenv.RouteSHM))
	local := register(t, m, alloc(t, 4096), mr.ReadWrite)
	first := testpeer.Start(t, testenv.RouteSHM)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, first.Register(4096, mr.ReadWrite, 1)))
	second := testpeer.Start(t, testenv.RouteSHM)
	h := second.Register(4096, mr.ReadWrite, 2)

	release := make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	defer let()
	transport.HoldEndpoint(m, release)
	registered := make(chan error, 1)
	go func() {
		b, err := m.Register(alloc(t, 4096), mr.ReadWrite)
		if err == nil {
			err = b.Close()
		}
		registered <- err
	}()
	require.Eventually(t, func() bool { return transport.EndpointSetHeld(m) }, 10*time.Second, time.Millisecond,
		"the registration never held the endpoint set")

	start := time.Now()
	err := m.ReadInto(ctxTimeout(t, time.Second), local, h)
	elapsed := time.Since(start)
	require.ErrorIs(t, err, transport.ErrTimeout)
	var te *progress.TimeoutError
	require.ErrorAs(t, err, &te)
	assert.True(t, te.Busy, "the timeout names the busy endpoint: %v", err)
	assert.Contains(t, err.Error(), "nothing moved")
	assert.Contains(t, err.Error(), "with fi_shm://", "the error names the owner's endpoint")
	assert.Less(t, elapsed, 5*time.Second, "the error came at the registration's wedge, not at the request's deadline")
	let()
	select {
	case <-registered:
	case <-time.After(30 * time.Second):
		t.Fatal("the registration never returned after the release")
	}
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, h), "once the endpoint set is free")
	assert.Equal(t, second.Sum(0, 0, 4096), testpeer.Sum(local.Bytes()))
}
