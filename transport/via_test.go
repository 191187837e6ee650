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
	for _, tc := range []struct {
		providers []string
		want      string
	}{
		{[]string{testenv.RouteMem, testenv.RouteTCP}, testenv.RouteMem},
		{[]string{testenv.RouteTCP}, testenv.RouteTCP},
	} {
		t.Run(tc.want, func(t *testing.T) {
			owner := testpeer.Start(t, testenv.RouteMem, testenv.RouteTCP)
			h := owner.Register(4096, mr.ReadWrite, 3)
			require.Len(t, h.Providers(), 2)
			m, err := transport.New(context.Background(), transport.WithProviders(tc.providers...))
			require.NoError(t, err)
			defer m.Close()
			rt, err := m.Route(h)
			require.NoError(t, err)
			require.Equal(t, tc.want, rt.Backend)
			via := h.Via(rt)
			assert.Equal(t, []string{tc.want}, via.Providers())
			assert.Equal(t, h.Len(), via.Len())
			local := register(t, m, alloc(t, 4096), mr.ReadWrite)
			require.NoError(t, m.ReadInto(context.Background(), local, via))
			again, err := m.Route(via)
			require.NoError(t, err)
			assert.Equal(t, rt.Backend, again.Backend)
		})
	}
}
