package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestShmOutRotation: on libfabric 2.x a manager's shm ops go out on an
// Outgoing endpoint that no handle or address names; once it took its
// share of names, an op moves to a new one, and the one it moved from
// closes once the request holding it ends, with the registration a
// buffer made there, and leaves the set; a request that picked it before
// is given the current one. The first endpoint inserts no peer but
// itself. On 1.x the first endpoint does everything.
func TestShmOutRotation(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	m, err := New(context.Background(), WithProviders("shm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	first := m.backends().sameNode
	e1 := m.backends().shmOut
	if fabric.RuntimeVersion().Major() < 2 {
		require.Nil(t, e1, "an Outgoing endpoint on libfabric 1.x")
		return
	}
	require.True(t, e1.Outgoing)
	require.EqualValues(t, 1, first.MapAdds(), "the first endpoint inserts itself only")

	mem, err := mr.Alloc(4096)
	require.NoError(t, err)
	defer func() { _ = mr.Free(mem) }()
	buf, err := m.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	defer func() { require.NoError(t, buf.Close()) }()
	for _, ep := range buf.Remote().eps {
		require.NotEqual(t, string(e1.EndpointName()), string(ep.name), "a handle names the Outgoing endpoint")
	}
	for _, ep := range m.Address().Endpoints {
		require.NotEqual(t, string(e1.EndpointName()), string(ep.Name), "the address names the Outgoing endpoint")
	}
	_, err = buf.st.desc(context.Background(), time.Time{}, e1) // an op's registration there
	require.NoError(t, err)
	require.True(t, buf.st.registeredOn(e1.Index))

	// Names the budget still admits go out on e1; the first it refuses
	// moves the op to a new endpoint.
	defer SetShmMapBudget(e1.MapAdds() + 1)()
	var o opSpec
	b, err := m.holdShm(&o, e1, []byte("fi_shm://1:0:0"), testTimes())
	require.NoError(t, err)
	require.Same(t, e1, b)
	b, err = m.holdShm(&o, e1, []byte("fi_shm://1:0:0"), testTimes())
	require.NoError(t, err)
	require.Same(t, e1, b, "a name admitted before takes no new slot")
	var o2 opSpec
	b, err = m.holdShm(&o2, e1, []byte("fi_shm://2:0:0"), testTimes())
	require.NoError(t, err)
	e2 := m.backends().shmOut
	require.Same(t, e2, b)
	require.NotSame(t, e1, e2)
	require.True(t, e1.Retired.Load())
	releaseOps([]opSpec{o2})

	require.True(t, e1.Hold(), "drained while a request held it")
	e1.Unhold()
	releaseOps([]opSpec{o})
	require.Eventually(t, e1.Stopped, 10*time.Second, time.Millisecond, "the retired endpoint closes once nothing holds it")
	require.False(t, buf.st.registeredOn(e1.Index), "the buffer's registration closed with it")
	require.Eventually(t, func() bool {
		for _, r := range m.backends().all {
			if r == e1 {
				return false
			}
		}
		return true
	}, 10*time.Second, time.Millisecond, "the closed endpoint left the set")
	var o3 opSpec
	b, err = m.holdShm(&o3, e1, []byte("fi_shm://3:0:0"), testTimes())
	require.NoError(t, err)
	require.NotSame(t, e1, b, "a request that picked the closed endpoint gets the current one")
	require.Same(t, m.backends().shmOut, b, "a request that picked the closed endpoint gets the current one")
	releaseOps([]opSpec{o3})
	require.EqualValues(t, 1, first.MapAdds(), "the first endpoint inserts itself only")
}
