package transport_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// TestPollRoutePollsOnlyItsRoute: a caller spinning with PollRoute on the
// route to a peer polls that route's endpoint at every call (a round, or
// a try while the loop's own goroutine holds it), and leaves the
// manager's other endpoints to their loops: no poll of theirs, and their
// loops stay parked, not held back by a caller that polls them now and
// then.
func TestPollRoutePollsOnlyItsRoute(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	testenv.RequireRoute(t, testenv.RouteTCP)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
	peer := testpeer.Start(t, testenv.RouteTCP)
	rt, err := m.Route(peer.Register(8, mr.ReadWrite, 1))
	require.NoError(t, err)
	require.Equal(t, testenv.RouteTCP, rt.Backend)
	waitParked(t, m, "idle")

	const n = 20000
	before, roundsBefore := transport.LoopPolls(m), transport.LoopRounds(m)
	for i := 0; i < n; i++ {
		m.PollRoute(rt)
	}
	after, roundsAfter := transport.LoopPolls(m), transport.LoopRounds(m)
	assert.Equal(t, uint64(n), after[testenv.RouteTCP]-before[testenv.RouteTCP],
		"polls of the route's endpoint in %d calls", n)
	assert.Zero(t, after[testenv.RouteSHM]-before[testenv.RouteSHM],
		"polls of the shm endpoint in %d calls for a tcp route", n)
	// Rounds are counted to within 16 at each end.
	assert.LessOrEqual(t, roundsAfter[testenv.RouteSHM]-roundsBefore[testenv.RouteSHM], uint64(32),
		"rounds of the shm endpoint in %d calls for a tcp route", n)
	assert.True(t, transport.LoopsParked(m)[testenv.RouteSHM], "the shm loop is parked")
}

// TestOutgoingShmLoopLeavesItsOpsToTheirWaiters: on libfabric 2.x the
// loop of the shm endpoint a manager's own ops go out on, which no peer
// reaches, does not spin after a stream of writes even with the busy
// policy: each write's waiter kicks it, and a spinning goroutine beside
// the waiters took a CPU on a small machine. It looks about once a
// millisecond. On 1.x there is no such endpoint.
func TestOutgoingShmLoopLeavesItsOpsToTheirWaiters(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM), transport.WithPollPolicy(progress.BusyPollPolicy))
	const outgoing = testenv.RouteSHM + "/outgoing"
	if fabric.RuntimeVersion().Major() < 2 {
		require.NotContains(t, transport.LoopRounds(m), outgoing)
		return
	}
	peer := testpeer.Start(t, testenv.RouteSHM)
	dst := peer.Register(8, mr.ReadWrite, 1)
	src := register(t, m, alloc(t, 8), mr.ReadWrite)
	rt, err := m.Route(dst)
	require.NoError(t, err)
	require.Equal(t, testenv.RouteSHM, rt.Backend)
	ctx := ctxTimeout(t, 30*time.Second)
	for i := 0; i < 200; i++ {
		require.NoError(t, m.WriteFrom(ctx, dst, src))
	}
	before, start := transport.LoopRounds(m)[outgoing], time.Now()
	time.Sleep(100 * time.Millisecond) // a span to count rounds in, not a readiness wait
	rounds, spell := transport.LoopRounds(m)[outgoing]-before, time.Since(start)
	// One round a millisecond at most, counted to within 16 at each end;
	// a spinning loop runs hundreds a millisecond.
	assert.LessOrEqual(t, rounds, uint64(spell/time.Millisecond)+34, "rounds of the outgoing shm loop in %v after the writes", spell)
}

// TestOpsOfARequestFlyTogether: an Action's shm write goes out while the
// request still waits for its tcp write before it (toward an owner that
// is stopped), on both libfabric versions. The request wakes the shm
// endpoint's loop, which otherwise pauses between its waiters' ops (an
// hour here: the poll policy's MaxSleep) and would post the write only
// when the request's wait reached it: on 2.x the outgoing endpoint's
// (progress.Loop.ServesNoPeers), on both the passive loop, which hands
// off to its callers.
func TestOpsOfARequestFlyTogether(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	testenv.RequireRoute(t, testenv.RouteTCP)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP),
		transport.WithPollPolicy(progress.PollPolicy{Spin: time.Hour, MaxSleep: time.Hour}))
	overTCP := testpeer.Start(t, testenv.RouteTCP)
	overSHM := testpeer.Start(t, testenv.RouteSHM)
	dstTCP := overTCP.Register(8, mr.ReadWrite, 1)
	dstSHM := overSHM.Register(8, mr.ReadWrite, 2)
	for dst, want := range map[*transport.RemoteBuffer]string{&dstTCP: testenv.RouteTCP, &dstSHM: testenv.RouteSHM} {
		rt, err := m.Route(*dst)
		require.NoError(t, err)
		require.Equal(t, want, rt.Backend)
	}
	src := register(t, m, alloc(t, 8), mr.ReadWrite)
	// Each owner's first op checks its handle with a read of the owner's
	// guard entry over shm first; the entry is kept after.
	ctx := ctxTimeout(t, 60*time.Second)
	require.NoError(t, m.WriteFrom(ctx, dstTCP, src))
	require.NoError(t, m.WriteFrom(ctx, dstSHM, src))
	shmLoop := testenv.RouteSHM
	if fabric.RuntimeVersion().Major() >= 2 {
		shmLoop += "/outgoing"
	}
	before := transport.LoopPosted(m)[shmLoop]

	overTCP.Stop() // its tcp write waits for it
	defer overTCP.Continue()
	a := m.NewAction().WriteFrom(dstTCP, src).WriteFrom(dstSHM, src)
	done := make(chan error, 1)
	go func() { done <- a.Submit(ctx) }()
	require.Eventually(t, func() bool { return transport.LoopPosted(m)[shmLoop] > before }, 10*time.Second, time.Millisecond,
		"the shm write was not posted while the request waited for its tcp write")
	select {
	case err := <-done:
		t.Fatalf("the request ended with its tcp owner stopped: %v", err)
	default:
	}
	overTCP.Continue()
	require.NoError(t, <-done)
}
