package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestShmOutRotation: the endpoint a manager's shm ops move to serves
// only them (no handle or address names it); the one it moved from, when
// it was an Outgoing one, closes once the request holding it ends, with
// the registration a buffer made there; a request that picked it before
// it closed is given the current one.
func TestShmOutRotation(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	m, err := New(context.Background(), WithProviders("shm"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	first := m.backends().sameNode
	require.NoError(t, m.rotateShmOut(first))
	e1 := m.backends().shmOut
	require.True(t, e1.Outgoing)
	require.False(t, first.Retired.Load(), "the first endpoint serves the buffers handles name")
	require.Same(t, first, m.backends().sameNode)

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

	var o opSpec
	b, err := m.holdShm(&o, e1)
	require.NoError(t, err)
	require.Same(t, e1, b)
	require.NoError(t, m.rotateShmOut(e1))
	e2 := m.backends().shmOut
	require.NotSame(t, e1, e2)
	require.True(t, e1.Retired.Load())
	require.True(t, e1.Hold(), "drained while a request held it")
	e1.Unhold()

	releaseOps([]opSpec{o})
	require.Eventually(t, e1.Stopped, 10*time.Second, time.Millisecond, "the retired endpoint closes once nothing holds it")
	require.False(t, buf.st.registeredOn(e1.Index), "the buffer's registration closed with it")
	var o2 opSpec
	b, err = m.holdShm(&o2, e1)
	require.NoError(t, err)
	require.Same(t, e2, b, "a request that picked the closed endpoint gets the current one")
	releaseOps([]opSpec{o2})
}
