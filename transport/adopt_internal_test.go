package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestAdoptSecondRegistration: a registration that lost the race to
// another op's (adopt) is closed within the request's limits: at once on
// a free endpoint; while a call holds the endpoint, it is kept as a spare
// and the request goes on with the first one's descriptor by its
// deadline; the buffer's Close closes the spare with its registration.
func TestAdoptSecondRegistration(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	m, err := New(context.Background(), WithProviders(testenv.RouteTCP))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	mem, err := mr.Alloc(4096)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(mem) })
	buf, err := m.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	st := buf.st
	b := m.backends().all[0]
	first, err := st.desc(context.Background(), time.Time{}, b)
	require.NoError(t, err)
	second := func() *spareMR {
		r, err := b.Register(mr.Region{Addr: st.base, Len: st.size, Access: st.access})
		require.NoError(t, err)
		return &spareMR{backend: b.Index, mr: r}
	}

	sp := second()
	assert.Equal(t, first, st.adopt(context.Background(), time.Now().Add(time.Minute), b, sp.mr))
	assert.Empty(t, st.spare, "closed at once on a free endpoint")

	sp = second() // registered before the endpoint is held
	release := make(chan struct{})
	HoldEndpoint(m, release)
	start := time.Now()
	assert.Equal(t, first, st.adopt(context.Background(), time.Now().Add(100*time.Millisecond), b, sp.mr))
	assert.Less(t, time.Since(start), 5*time.Second, "adopt waited past the request's deadline")
	require.Len(t, st.spare, 1, "kept for the buffer's Close")
	close(release)
	require.NoError(t, buf.Close())
	assert.Empty(t, st.spare, "the buffer's Close closed the spare")
}
