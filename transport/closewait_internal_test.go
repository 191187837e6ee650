package transport

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestCloseWaitsOneTimeout: Buffer.Close waits the manager's timeout in
// all, for a peer's copy on the mem route and then for a transfer of its
// own, not a timeout for each: a peer that leaves just before the
// deadline does not start a second wait.
func TestCloseWaitsOneTimeout(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const timeout = time.Second
	m, err := New(context.Background(), WithProviders(mem.Name), WithTimeout(timeout))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	b, err := m.Alloc(4096, mr.ReadWrite)
	require.NoError(t, err)
	st := b.st
	require.True(t, st.shared && st.hasGrd, "a shared buffer with a guard entry")

	peer := copyingPeer(t, m, st)
	st.hold() // and a transfer of this process that does not end

	// The peer's copy ends late in the wait.
	leave := time.AfterFunc(timeout*8/10, func() { peer.uses.Leave(st.guard) })
	defer leave.Stop()
	start := time.Now()
	err = b.Close()
	elapsed := time.Since(start)
	var inUse *InUseError
	require.ErrorAs(t, err, &inUse)
	assert.Equal(t, 1, inUse.Transfers)
	assert.Empty(t, inUse.Peers, "the peer left in time")
	assert.Equal(t, timeout, inUse.Waited)
	assert.Less(t, elapsed, timeout*3/2, "Close waited past the manager's timeout")
	st.Unref()
}

// TestCloseRacingManagerClose: a Buffer.Close still waiting for its
// transfers when Manager.Close runs has left the manager's list of
// buffers; its registrations are closed all the same, before the
// endpoint, and its memory is freed only after that.
func TestCloseRacingManagerClose(t *testing.T) {
	for _, route := range []string{testenv.RouteTCP, testenv.RouteSHM} {
		t.Run(route, func(t *testing.T) {
			testenv.RequireRoute(t, route)
			m, err := New(context.Background(), WithProviders(route))
			require.NoError(t, err)
			t.Cleanup(func() { _ = m.Close() })
			b, err := m.Alloc(4096, mr.ReadWrite)
			require.NoError(t, err)
			st := b.st
			require.NotEmpty(t, st.mrs)
			require.NotNil(t, st.mrs[0], "registered on the endpoint")

			require.NoError(t, st.ref()) // a transfer of this process, under way
			closed := make(chan error, 1)
			go func() { closed <- b.Close() }()
			require.Eventually(t, func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return st.closed && st.drained != nil
			}, 10*time.Second, time.Millisecond, "Buffer.Close waits for the transfer")

			require.NoError(t, m.Close())
			st.Unref() // the transfer ends: Close deregisters now
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(time.Minute):
				t.Fatal("Buffer.Close did not return")
			}
			st.mrsMu.Lock()
			for i, r := range st.mrs {
				assert.Nil(t, r, "the registration on backend %d was never closed", i)
			}
			assert.Empty(t, st.spare)
			st.mrsMu.Unlock()
			// The last Unref frees it, on a goroutine of its own.
			assert.Eventually(t, func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return !st.owned
			}, 10*time.Second, time.Millisecond, "the memory was never freed")
		})
	}
}

// TestManagerCloseLetsBufferCloseWait: a Buffer.Close waiting for a
// peer's copy on the mem route when Manager.Close runs goes on waiting,
// to its deadline: Manager.Close releasing the peers' pages must not
// make the copy look done, or Close would return nil with the copy still
// writing the memory.
func TestManagerCloseLetsBufferCloseWait(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const timeout = time.Second
	m, err := New(context.Background(), WithProviders(mem.Name), WithTimeout(timeout))
	require.NoError(t, err)
	b, err := m.Alloc(4096, mr.ReadWrite)
	require.NoError(t, err)
	copyingPeer(t, m, b.st) // a copy that does not end

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	require.Eventually(t, func() bool {
		m.memPeers.mu.Lock()
		defer m.memPeers.mu.Unlock()
		return m.memPeers.waiting > 0
	}, 10*time.Second, time.Millisecond, "Buffer.Close waits for the peer")
	require.NoError(t, m.Close())
	select {
	case err := <-closed:
		var inUse *InUseError
		require.ErrorAs(t, err, &inUse, "the copy had not ended")
		assert.Equal(t, []int{os.Getpid()}, inUse.Peers)
	case <-time.After(10 * time.Second):
		t.Fatal("Buffer.Close did not return")
	}
}

// copyingPeer adds to m a mem peer (this process) in a copy of st's
// buffer: its use mark, as serveMem keeps it.
func copyingPeer(t *testing.T, m *Manager, st *bufState) *memPeer {
	t.Helper()
	page, err := mr.Alloc(useSlots * 4)
	require.NoError(t, err)
	peer := &memPeer{pid: os.Getpid(), pidfd: -1, page: page, uses: mem.UsesOf(page)}
	m.memPeers.mu.Lock()
	m.memPeers.list = append(m.memPeers.list, peer)
	m.memPeers.mu.Unlock()
	peer.uses.Mark(st.guard)
	return peer
}
