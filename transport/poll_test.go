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
// policy: each write's waiter drove it, and a spinning goroutine beside
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
