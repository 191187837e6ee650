package transport_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
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
// of polling every millisecond; a same-node peer that verified it keeps
// its shm loop polling, since shm has no wait object and the peer may
// need the owner's progress at any time, until the peer goes; and ops
// after the idle spell, both ways, still complete.
func TestIdleManagerParksItsLoops(t *testing.T) {
	m := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
	mem := alloc(t, 4096)
	buf := register(t, m, mem, mr.ReadWrite)
	waitParked(t, m, "idle")

	// This manager reads from an owner over tcp after its idle spell; the
	// owner, idle too, reads this manager's buffer back over shm.
	tcpPeer := testpeer.Start(t, testenv.RouteTCP)
	remote := tcpPeer.Register(8, mr.ReadWrite, 1)
	dst, err := buf.Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), dst, remote))
	assert.Equal(t, testpeer.Pattern(8, 1), mem[:8])

	shmPeer := testpeer.Start(t, testenv.RouteSHM)
	shmPeer.Register(8, mr.ReadWrite, 2)
	mine, err := buf.Remote().Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, shmPeer.Transfer("read", 0, mine))
	// The peer stays verified: the shm loop polls for it, past the spin
	// that follows activity and for as long as the test looks.
	spin := 10 * time.Millisecond
	time.Sleep(spin)
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		require.False(t, transport.LoopsParked(m)[testenv.RouteSHM], "the shm loop parked while a verified peer may need it")
	}
	shmPeer.Close()
	waitParked(t, m, "once the peer left")
}
