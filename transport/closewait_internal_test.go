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

	// A peer in a copy of the buffer (its use mark), as serveMem keeps it.
	page, err := mr.Alloc(useSlots * 4)
	require.NoError(t, err)
	peer := &memPeer{pid: os.Getpid(), pidfd: -1, page: page, uses: mem.UsesOf(page)}
	m.memPeers.mu.Lock()
	m.memPeers.list = append(m.memPeers.list, peer)
	m.memPeers.mu.Unlock()
	peer.uses.Mark(st.guard)
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
