package transport_test

import (
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

// waitParked waits until every progress loop of m is parked.
func waitParked(t *testing.T, m *transport.Manager, what string) {
	t.Helper()
	var last map[string]bool
	parked := func() bool {
		last = transport.LoopsParked(m)
		for _, p := range last {
			if !p {
				return false
			}
		}
		return true
	}
	if !assert.Eventually(t, parked, 10*time.Second, time.Millisecond) {
		t.Fatalf("%s: loops not parked: %v", what, last)
	}
}

// TestIdleManagerParksItsLoops: a manager with nothing to do parks every
// progress loop (tcp blocks in fi_cq_sread, shm waits for a kick) instead
// of polling every millisecond; a same-node peer that verified it and
// uses cma leaves it parked, since cma needs no progress of the owner; a
// peer that uses shm keeps its shm loop polling, since shm has no wait
// object and the peer may need the owner's progress at any time, until
// the peer goes; and ops after the idle spell, both ways, still complete.
func TestIdleManagerParksItsLoops(t *testing.T) {
	provs := []string{testenv.RouteSHM, testenv.RouteTCP}
	withCMA, _ := transport.CMAAvailable()
	if withCMA {
		provs = append(provs, testenv.RouteCMA)
	}
	// Short, so that what follows it shows within the test.
	t.Cleanup(transport.SetFirstOpGrace(20 * time.Millisecond)) // after the manager closes
	m := newManager(t, transport.WithProviders(provs...))
	mem := alloc(t, 4096)
	buf := register(t, m, mem, mr.ReadWrite)
	mine, err := buf.Remote().Slice(0, 8)
	require.NoError(t, err)
	waitParked(t, m, "idle")

	// This manager reads from an owner over tcp after its idle spell.
	tcpPeer := testpeer.Start(t, testenv.RouteTCP)
	remote := tcpPeer.Register(8, mr.ReadWrite, 1)
	dst, err := buf.Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), dst, remote))
	assert.Equal(t, testpeer.Pattern(8, 1), mem[:8])
	waitParked(t, m, "after a read")

	t.Run("cma peer", func(t *testing.T) {
		testenv.RequireRoute(t, testenv.RouteCMA)
		p := testpeer.Start(t, testenv.RouteCMA)
		p.Register(8, mr.ReadWrite, 2)
		require.NoError(t, p.Transfer("read", 0, mine))
		waitParked(t, m, "a verified cma peer connected")
	})

	// The owner, idle too, is read over shm: the peer announced itself,
	// and the shm loop polls for it, past the spin that follows activity
	// and the grace that follows a verification, for as long as the test
	// looks.
	shmPeer := testpeer.Start(t, testenv.RouteSHM)
	shmPeer.Register(8, mr.ReadWrite, 3)
	require.NoError(t, shmPeer.Transfer("read", 0, mine))
	time.Sleep(50 * time.Millisecond) // past Spin and the grace
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		require.False(t, transport.LoopsParked(m)[testenv.RouteSHM], "the shm loop parked while a peer using shm may need it")
	}
	shmPeer.Close()
	waitParked(t, m, "once the shm peer left")
}

// TestShmPeerWakesIdleOwner: a peer's shm op after an idle spell wakes
// the owner's shm loop, which sleeps between looks while idle (shm's CQ
// has no wait object a peer's command wakes). The owner here looks only
// after activity or a wake (MinSleep and MaxSleep an hour), so each op
// after the first completes only if the peer's wake reached it. shm
// needs the owner's progress for every op on libfabric 2.x, and on 1.x
// once CMA is off (FI_SHM_DISABLE_CMA, in the peer: it inherits this
// process's environment).
func TestShmPeerWakesIdleOwner(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	t.Setenv("FI_SHM_DISABLE_CMA", "1")
	// The owner looks for Spin after a wake: long enough that a peer's
	// op preempted between its wake and its post still lands in it.
	const spin = 100 * time.Millisecond
	m := newManager(t, transport.WithProviders(testenv.RouteSHM),
		transport.WithPollPolicy(progress.PollPolicy{Spin: spin, MinSleep: time.Hour, MaxSleep: time.Hour}))
	mem := alloc(t, 4096)
	buf := register(t, m, mem, mr.ReadWrite)
	mine, err := buf.Remote().Slice(0, 8)
	require.NoError(t, err)

	p := testpeer.Start(t, testenv.RouteSHM)
	p.Register(8, mr.ReadWrite, 1)
	idle := func() { time.Sleep(3 * spin) } // past the owner's Spin after the last op: it sleeps
	idle()
	require.NoError(t, p.Transfer("write", 0, mine), "a write after an idle spell")
	assert.Equal(t, testpeer.Pattern(8, 1), mem[:8])
	testpeer.Fill(mem, 5)
	idle()
	require.NoError(t, p.Transfer("read", 0, mine), "a read after an idle spell")
	assert.Equal(t, testpeer.Sum(testpeer.Pattern(8, 5)), p.Sum(0, 0, 8))
	clear(mem)
	idle()
	require.NoError(t, p.Transfer("write", 0, mine), "a write after an idle spell")
	assert.Equal(t, testpeer.Pattern(8, 5), mem[:8])
}
