package transport

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/mr"
)

// TestLiveCountFollowsLiveManagers: liveCount, which lets route skip the
// lookup of another manager of this process, counts the managers
// liveManagers holds — also after Close ran for a manager that New never
// counted (its failure paths close what they opened) — so that a handle
// of another open manager is still served by a copy. (No test of this
// package runs in parallel: the count is the process's.)
func TestLiveCountFollowsLiveManagers(t *testing.T) {
	count := func() int32 {
		n := int32(0)
		liveManagers.Range(func(any, any) bool { n++; return true })
		return n
	}
	open := func() *Manager {
		m, err := New(context.Background())
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	require.Equal(t, count(), liveCount.Load())
	a, b := open(), open()
	require.GreaterOrEqual(t, liveCount.Load(), int32(2))
	assert.Equal(t, count(), liveCount.Load())
	// The state a New that failed after opening leaves: b neither stored
	// nor counted, then closed.
	liveManagers.Delete(b.id)
	liveCount.Add(-1)
	require.NoError(t, b.Close())
	assert.Equal(t, count(), liveCount.Load(), "after closing a manager New never counted")

	mem, err := mr.Alloc(4096)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(mem) })
	buf, err := a.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	t.Cleanup(func() { _ = buf.Close() })
	c := open()
	rt, err := c.Route(buf.Remote())
	require.NoError(t, err)
	assert.Equal(t, "memcpy", rt.Backend, "a handle of another open manager of this process")
}
