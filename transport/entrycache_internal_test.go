package transport

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeepOnlyLiveEntries: a guard entry read from an owner is kept only
// when the generation the owner published was the entry's before and
// after the read, and odd (a buffer holds the slot); a kept entry serves
// checks only while that generation stands.
func TestKeepOnlyLiveEntries(t *testing.T) {
	entry := func(gen uint64) *[guardEntrySize]byte {
		var e [guardEntrySize]byte
		binary.LittleEndian.PutUint64(e[8*gwGen:], gen)
		return &e
	}
	link := func(slots int) *memLink {
		return &memLink{owner: &sameNodePeer{}, pidfd: -1, gens: make([]uint64, slots)}
	}
	for _, tc := range []struct {
		name                string
		before, read, after uint64 // published before the read, the entry's, published after
		kept                bool
	}{
		{"live", 3, 3, 3, true},
		{"revoked", 4, 4, 4, false},
		{"published during the read", 2, 3, 3, false},
		{"revoked during the read", 3, 3, 4, false},
		{"closed and reused during the read", 3, 5, 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := link(4)
			l.gens[1] = tc.after
			l.keep(1, entry(tc.read), tc.before)
			var got [guardEntrySize]byte
			assert.Equal(t, tc.kept, l.lookup(1, &got))
		})
	}

	l := link(entryCacheSize + 2)
	l.gens[1] = 3
	l.keep(1, entry(3), 3)
	var got [guardEntrySize]byte
	require.True(t, l.lookup(1, &got))
	assert.Equal(t, *entry(3), got)

	other := uint32(1 + entryCacheSize) // the same place in the cache
	l.gens[other] = 7
	l.keep(other, entry(7), 7)
	assert.True(t, l.lookup(1, &got), "a valid entry keeps its place")
	assert.False(t, l.lookup(other, &got))

	l.gens[1] = 4 // revoked
	assert.False(t, l.lookup(1, &got), "a kept entry serves only its generation")
	l.keep(other, entry(7), 7)
	assert.True(t, l.lookup(other, &got), "a stale entry gives its place up")

	l.owner.gone.Store(true)
	assert.False(t, l.lookup(other, &got), "nothing is served once the owner is gone")
}
