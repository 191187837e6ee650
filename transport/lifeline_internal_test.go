package transport

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/lifeline"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestGuardTableHoldsLifeline: where the mem route can share memory, the
// published generations carry this process's lifeline after them, held
// (peers' ops read it instead of polling a pidfd), and the size an owner
// answers a mem peer with says where it is; a released one reads as not
// alive, and a peer's op falls back to asking the kernel.
func TestGuardTableHoldsLifeline(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	g, err := newGuardTable()
	require.NoError(t, err)
	defer func() {
		g.life.Release() // before the memory it uses goes
		_ = mr.Free(g.mem)
		_ = mr.Free(g.gens)
	}()
	require.NotNil(t, g.life, "the lifeline is held")
	require.Len(t, g.gens, lifeOffset+lifeline.Size, "generations, then the lifeline")
	word, _ := mr.Word32(g.gens, lifeOffset)
	assert.True(t, lifeline.Alive(word))
	g.life.Release()
	assert.False(t, lifeline.Alive(word), "released: peers ask the kernel")
}
