package libfabric

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

// TestRetireWaitsForHoldsAndPeers: a retired route drains only once no
// request holds it and no peer is in use, and then refuses holds. It
// forgets no peer meanwhile: a request still holding it finds its peer
// inserted, not inserted again in a new slot of shm's map.
func TestRetireWaitsForHoldsAndPeers(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	r := openWith(t, fabric.BackendSHM, shmHints())
	owner := openWith(t, fabric.BackendSHM, shmHints())
	drained := make(chan struct{})

	require.True(t, r.Hold())
	r.Retire(func() { close(drained) })
	require.True(t, r.Retired.Load())
	r.maybeDrained() // as every release does
	require.Positive(t, r.holds.Load(), "drained while a request holds it")
	p, err := r.Peer(owner.EndpointName()) // the request takes its peer
	require.NoError(t, err)
	adds := r.MapAdds()

	r.Unhold()
	r.maybeDrained()
	require.Zero(t, r.holds.Load(), "drained while its peer is in use")
	require.True(t, r.Hold(), "a request may still pick it: it has not drained")
	q, err := r.Peer(owner.EndpointName())
	require.NoError(t, err)
	require.Same(t, p, q)
	q.Done()
	r.Unhold()
	require.Zero(t, r.holds.Load(), "drained while its peer is in use")
	require.Equal(t, adds, r.MapAdds(), "the peer was inserted again")

	p.Done() // the last use: the route drains
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("not drained 10 s after its last hold and peer use ended")
	}
	require.False(t, r.Hold(), "a drained route takes no hold")
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.peers, 1, "closing the endpoint releases the peers, not Retire")
}

// TestMapAddsCounts: every insert of a new name counts, a name already
// inserted does not; on a route that RecyclesSlots, Admit counts a new
// name once, before its insert, and refuses new names past the budget;
// past mapAddsMax it inserts nothing more; a retiring route admits
// nothing.
func TestMapAddsCounts(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	r := openWith(t, fabric.BackendSHM, shmHints())
	owner := openWith(t, fabric.BackendSHM, shmHints())
	other := openWith(t, fabric.BackendSHM, shmHints())
	require.Zero(t, r.MapAdds())
	for range 2 {
		p, err := r.Peer(owner.EndpointName())
		require.NoError(t, err)
		p.Done()
	}
	require.EqualValues(t, 1, r.MapAdds())
	recycles := fabric.RuntimeVersion().Major() >= 2
	require.Equal(t, recycles, r.RecyclesSlots())
	require.True(t, r.Admit(owner.EndpointName(), 1), "a name inserted already takes no new slot")
	require.Equal(t, !recycles, r.Admit(other.EndpointName(), 1), "a new name past the budget")
	require.True(t, r.Admit(other.EndpointName(), 2))
	p, err := r.Peer(other.EndpointName())
	require.NoError(t, err)
	p.Done()
	want := int64(2) // the insert Admit counted counts once
	require.Equal(t, want, r.MapAdds())
	_, err = r.Peer([]byte("fi_shm://999999999:0:0")) // no region: not inserted, not counted
	require.Error(t, err)
	require.Equal(t, want, r.MapAdds())
	third := openWith(t, fabric.BackendSHM, shmHints())
	r.inserts.Store(mapAddsMax) // as after many inserts no Admit counted
	p, err = r.Peer(third.EndpointName())
	if recycles {
		require.ErrorIs(t, err, errclass.ErrBlocked, "an insert past mapAddsMax")
		require.NotErrorIs(t, err, errclass.ErrRouteReplaced, "a route that is not Outgoing stays the manager's")
		r.Outgoing = true
		_, err = r.Peer(third.EndpointName())
		require.ErrorIs(t, err, errclass.ErrBlocked)
		require.ErrorIs(t, err, errclass.ErrRouteReplaced, "an Outgoing route admits no new name past the budget: the next request takes another")
		require.False(t, r.Admit(third.EndpointName(), mapAddsMax), "what the next request toward it finds (any budget up to mapAddsMax)")
	} else {
		require.NoError(t, err, "1.x's map has no slot to recycle")
		p.Done()
	}
	r.Retire(func() {})
	require.False(t, r.Admit(owner.EndpointName(), 1000), "a retiring route admits nothing")
}

// TestLeaveSlots: only names whose region this process maps count as
// slots left taken (a peer may name endpoints that never came here), each
// once. (ReleaseIncoming takes one off: TestOwnerReplacesAnShmEndpointPeersLeftFull
// in transport sees the count stay at zero while peers verify again.)
func TestLeaveSlots(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	r := openWith(t, fabric.BackendSHM, shmHints())
	peer := openWith(t, fabric.BackendSHM, shmHints())
	p, err := r.Peer(peer.EndpointName()) // r maps peer's region
	require.NoError(t, err)
	p.Done()
	made := []byte(fmt.Sprintf("fi_shm://%d:%d:99\x00", os.Getpid(), os.Geteuid()))
	assert.Zero(t, r.LeaveSlots([][]byte{made}), "a name no op brought here")
	assert.Equal(t, 1, r.LeaveSlots([][]byte{peer.EndpointName(), made}))
	assert.Equal(t, 1, r.LeaveSlots([][]byte{peer.EndpointName()}), "once each")
	assert.Equal(t, 1, r.LeftSlots())
}
