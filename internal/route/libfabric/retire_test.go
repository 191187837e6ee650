package libfabric

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

// TestRetireWaitsForHoldsAndPeers: a retired route drains only once no
// request holds it and no peer is in use, and then refuses holds; a peer
// it takes while retiring leaves with its last use.
func TestRetireWaitsForHoldsAndPeers(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	r := openWith(t, fabric.BackendSHM, shmHints())
	owner := openWith(t, fabric.BackendSHM, shmHints())
	drained := make(chan struct{})
	isDrained := func() bool {
		select {
		case <-drained:
			return true
		default:
			return false
		}
	}

	require.True(t, r.Hold())
	r.Retire(func() { close(drained) })
	require.True(t, r.Retired.Load())
	r.maybeDrained() // as the retire's own goroutine and every release do
	require.False(t, isDrained(), "drained while a request holds it")
	p, err := r.Peer(owner.EndpointName()) // the request takes its peer
	require.NoError(t, err)

	r.Unhold()
	r.maybeDrained()
	require.False(t, isDrained(), "drained while its peer is in use")
	require.True(t, r.Hold(), "a request may still pick it: it has not drained")
	q, err := r.Peer(owner.EndpointName())
	require.NoError(t, err)
	require.Same(t, p, q)
	q.Done()
	r.Unhold()
	require.False(t, isDrained(), "drained while its peer is in use")

	p.Done() // the last use: the peer is forgotten, and the route drains
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("not drained 10 s after its last hold and peer ended")
	}
	require.False(t, r.Hold(), "a drained route takes no hold")
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Empty(t, r.peers)
}

// TestMapAddsCounts: every insert of a new name counts, a name already
// inserted does not, and contacts count.
func TestMapAddsCounts(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	r := openWith(t, fabric.BackendSHM, shmHints())
	owner := openWith(t, fabric.BackendSHM, shmHints())
	require.Zero(t, r.MapAdds())
	for range 2 {
		p, err := r.Peer(owner.EndpointName())
		require.NoError(t, err)
		p.Done()
	}
	require.EqualValues(t, 1, r.MapAdds())
	r.NoteContact()
	require.EqualValues(t, 2, r.MapAdds())
	require.Equal(t, fabric.RuntimeVersion().Major() >= 2, r.RecyclesSlots())
}
