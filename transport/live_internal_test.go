package transport

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLiveCountFollowsLiveManagers: liveCount, which lets route skip the
// lookup of another manager of this process, counts exactly the managers
// liveManagers holds — also when Close runs for a manager that New never
// counted (its failure paths close what they opened).
func TestLiveCountFollowsLiveManagers(t *testing.T) {
	count := func() int32 {
		n := int32(0)
		liveManagers.Range(func(any, any) bool { n++; return true })
		return n
	}
	require.Equal(t, count(), liveCount.Load())
	a, err := New(context.Background())
	require.NoError(t, err)
	b, err := New(context.Background())
	require.NoError(t, err)
	assert.Equal(t, count(), liveCount.Load())
	// As if New had failed for b after opening it: not yet counted.
	liveManagers.Delete(b.id)
	liveCount.Add(-1)
	require.NoError(t, b.Close())
	assert.Equal(t, count(), liveCount.Load(), "after closing a manager New never counted")
	require.NoError(t, a.Close())
	assert.Equal(t, count(), liveCount.Load())
}
