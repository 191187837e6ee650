package transport_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestVia: a handle narrowed to the route Route gave keeps only that
// route's endpoints and still transfers over it. What it is for, failing
// rather than taking another endpoint once the route goes away, is
// test.TestServeWritesOnlyWhereItChecked.
func TestVia(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	testenv.RequireRoute(t, testenv.RouteTCP)
	testenv.RequireRoute(t, testenv.RouteCMA)
	for _, tc := range []struct {
		providers []string
		want      string
		kept      []string // the same-node endpoints, all of them, on a same-node route
	}{
		{[]string{testenv.RouteMem, testenv.RouteTCP}, testenv.RouteMem, []string{testenv.RouteMem, testenv.RouteCMA}},
		{[]string{testenv.RouteTCP}, testenv.RouteTCP, []string{testenv.RouteTCP}},
	} {
		t.Run(tc.want, func(t *testing.T) {
			owner := testpeer.Start(t, testenv.RouteMem, testenv.RouteCMA, testenv.RouteTCP)
			h := owner.Register(4096, mr.ReadWrite, 3)
			require.ElementsMatch(t, []string{testenv.RouteMem, testenv.RouteCMA, testenv.RouteTCP}, h.Providers())
			m, err := transport.New(context.Background(), transport.WithProviders(tc.providers...))
			require.NoError(t, err)
			defer m.Close()
			rt, err := m.Route(h)
			require.NoError(t, err)
			require.Equal(t, tc.want, rt.Backend)
			via := h.Via(rt)
			assert.ElementsMatch(t, tc.kept, via.Providers())
			assert.Equal(t, h.Len(), via.Len())
			local := register(t, m, alloc(t, 4096), mr.ReadWrite)
			require.NoError(t, m.ReadInto(context.Background(), local, via))
			again, err := m.Route(via)
			require.NoError(t, err)
			assert.Equal(t, rt.Backend, again.Backend)
		})
	}
}

// TestViaAnotherRoute: a handle narrowed to a route that is not its own
// keeps no endpoint, and a transfer with it says so and names the fix,
// instead of listing an empty offer as if the owner had made it.
func TestViaAnotherRoute(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	owner := testpeer.Start(t, testenv.RouteTCP)
	h := owner.Register(4096, mr.ReadWrite, 3)
	m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteTCP))
	require.NoError(t, err)
	defer m.Close()
	local := register(t, m, alloc(t, 4096), mr.ReadWrite)
	for _, rt := range []transport.Route{{}, {Backend: "efa"}, {Backend: testenv.RouteTCP, Host: "192.0.2.1"}} {
		via := h.Via(rt)
		assert.Empty(t, via.Providers(), "route %+v", rt)
		err := m.ReadInto(context.Background(), local, via)
		require.ErrorIs(t, err, transport.ErrNoRoute, "route %+v", rt)
		assert.Contains(t, err.Error(), "RemoteBuffer.Via keeps only the endpoints of the route it is given", "route %+v", rt)
	}
}

// TestReleased: Released closes once the buffer is closed and nothing
// uses its memory (at once for an idle one, whoever closed it), and not
// before. The case it is for, a Close that left ops with the provider,
// is test.TestServeFreesBuffersItsStalledAnswersHeld.
func TestReleased(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteTCP))
	require.NoError(t, err)
	a, err := m.Alloc(4096, mr.ReadWrite)
	require.NoError(t, err)
	b := register(t, m, alloc(t, 4096), mr.ReadWrite)
	c := register(t, m, alloc(t, 4096), mr.ReadWrite)
	early := c.Released() // made before the close
	for _, buf := range []*transport.Buffer{a, b, c} {
		select {
		case <-buf.Released():
			t.Fatal("released while open")
		default:
		}
	}
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.NoError(t, m.Close()) // closes c
	for _, ch := range []<-chan struct{}{a.Released(), b.Released(), early} {
		select {
		case <-ch:
		default:
			t.Fatal("not released after its close")
		}
	}
}
