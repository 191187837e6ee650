package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestAdoptSecondRegistration: a registration that lost the race to
// another op's (adopt) is closed within the request's limits: at once on
// a free endpoint; while a call holds the endpoint, it is kept as a spare
// and the request goes on with the first one's descriptor by its
// deadline; the backend's closeMR closes the spare with its registration.
// One made after closeMR ran for the backend (its rail replaced) is not
// kept: the op fails with ErrClosed.
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

	adopt := func(sp *spareMR, d time.Duration) fabric.Desc {
		t.Helper()
		desc, err := st.adopt(context.Background(), time.Now().Add(d), b, sp.mr)
		require.NoError(t, err)
		return desc
	}
	sp := second()
	assert.Equal(t, first, adopt(sp, time.Minute))
	assert.Empty(t, st.spare, "closed at once on a free endpoint")

	sp = second() // registered before the endpoint is held
	release := make(chan struct{})
	HoldEndpoint(m, release)
	start := time.Now()
	assert.Equal(t, first, adopt(sp, 100*time.Millisecond))
	assert.Less(t, time.Since(start), 5*time.Second, "adopt waited past the request's deadline")
	require.Len(t, st.spare, 1, "kept for the buffer's Close")
	close(release)

	// The backend's registrations were closed (its rail replaced) while a
	// request registered the buffer there: nothing may keep the new one.
	sp = second()
	require.NoError(t, b.Do(func() { st.closeMR(b.Index) }))
	assert.Empty(t, st.spare, "closeMR closed the spare")
	_, err = st.adopt(context.Background(), time.Now().Add(time.Minute), b, sp.mr)
	require.ErrorIs(t, err, ErrClosed)
	assert.Empty(t, st.spare)
	assert.Nil(t, st.mrs[b.Index], "a registration kept after closeMR would never be closed")
	require.NoError(t, buf.Close())
}
