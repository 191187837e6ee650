package transport

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/route/mem"
)

// TestLinkFreedOnlyWhenUnheld: ops hold and drop a link while it ends;
// its pages are freed once nobody holds it, never while an op does (an
// op that holds touches the use page, which a free under it unmaps: a
// fault), and an ended link is not held again.
func TestLinkFreedOnlyWhenUnheld(t *testing.T) {
	const rounds, ops = 3000, 3
	for r := 0; r < rounds; r++ {
		page, err := unix.Mmap(-1, 0, useSlots*4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		l := &memLink{pidfd: -1, page: page, uses: mem.UsesOf(page)}
		var held, wrong atomic.Int64
		var wg sync.WaitGroup
		for g := 0; g < ops; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for l.hold() {
					held.Add(1)
					l.uses.Mark(0)
					l.uses.Leave(0)
					if l.users.Load()&^linkEndedBit == 0 {
						wrong.Add(1) // held, yet not counted
					}
					l.drop()
				}
			}()
		}
		for held.Load() < int64(ops) {
		}
		l.end()
		wg.Wait()
		require.Zero(t, wrong.Load(), "round %d: an op held the link while its count was zero", r)
		require.Equal(t, int64(linkEndedBit), l.users.Load(), "round %d: users left", r)
		require.False(t, l.hold(), "an ended link is held")
	}
}
