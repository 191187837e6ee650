package libfabric

import (
	"encoding/binary"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeRegion builds an SMR_VERSION 4 region header of this process named
// name, with its peer data and name where shm puts them.
func fakeRegion(name string) []byte {
	const pd = 4096
	no := pd + smrMaxPeers*smrPeerDataSize
	mem := make([]byte, no+4096)
	le := binary.LittleEndian
	mem[0] = smrVersion4
	le.PutUint16(mem[smrHdrFlags:], 1) // SMR_FLAG_ATOMIC
	le.PutUint32(mem[smrHdrPID:], uint32(os.Getpid()))
	le.PutUint64(mem[smrHdrTotalSize:], uint64(len(mem)))
	le.PutUint64(mem[smrHdrPeerDataOff:], pd)
	le.PutUint64(mem[smrHdrNameOff:], uint64(no))
	copy(mem[no:], name)
	return mem
}

func TestRegionLayout(t *testing.T) {
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		edit func(mem []byte)
		ok   bool
	}{
		{"shm's own", func([]byte) {}, true},
		{"another version", func(m []byte) { m[0] = 5 }, false},
		{"a debug build", func(m []byte) { le.PutUint16(m[smrHdrFlags:], 1|smrFlagDebug) }, false},
		{"another process", func(m []byte) { le.PutUint32(m[smrHdrPID:], uint32(os.Getpid()+1)) }, false},
		{"another size", func(m []byte) { le.PutUint64(m[smrHdrTotalSize:], uint64(len(m)+1)) }, false},
		{"peer data past the name", func(m []byte) { le.PutUint64(m[smrHdrPeerDataOff:], 8192) }, false},
		{"peer data in the header", func(m []byte) { le.PutUint64(m[smrHdrPeerDataOff:], 8) }, false},
		{"peer data wrapping round", func(m []byte) { le.PutUint64(m[smrHdrPeerDataOff:], ^uint64(0)-64) }, false},
		{"name past the end", func(m []byte) { le.PutUint64(m[smrHdrNameOff:], uint64(len(m))) }, false},
		{"name at the last byte", func(m []byte) { le.PutUint64(m[smrHdrNameOff:], uint64(len(m)-1)) }, false},
		{"name offset wrapping round", func(m []byte) { le.PutUint64(m[smrHdrNameOff:], ^uint64(0)-4) }, false},
		{"another name", func(m []byte) { m[le.Uint64(m[smrHdrNameOff:])] = '9' }, false},
		{"a longer name", func(m []byte) { m[le.Uint64(m[smrHdrNameOff:])+9] = '1' }, false},
		{"libfabric 1.18's shorter header", func(m []byte) {
			// No cmd_cnt and sar_cnt: the offsets 16 bytes earlier, then
			// the socket name's, then the header's end.
			pd, no := le.Uint64(m[smrHdrPeerDataOff:]), le.Uint64(m[smrHdrNameOff:])
			le.PutUint64(m[smrHdrPeerDataOff-16:], pd)
			le.PutUint64(m[smrHdrNameOff-16:], no)
			le.PutUint64(m[smrHdrPeerDataOff:], no+smrNameMax)
			le.PutUint64(m[smrHdrNameOff:], 0)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := fakeRegion("17477:0:0")
			tc.edit(mem)
			pd, ok := regionLayout(mem, "17477:0:0")
			require.Equal(t, tc.ok, ok)
			if ok {
				assert.Equal(t, 4096, pd)
			}
		})
	}
}

// TestClearHandshake: the slot that names a peer is found by that name
// alone, and clearing it leaves the slot as before its first peer: no
// answer, no name sent; the other slots are untouched.
func TestClearHandshake(t *testing.T) {
	mem := fakeRegion("1:0:0")
	o := &ownRegion{mem: mem, peerData: 4096}
	le := binary.LittleEndian
	for i := 0; i < smrMaxPeers; i++ {
		e := mem[4096+i*smrPeerDataSize:]
		le.PutUint64(e[smrPeerDataID:], uint64(i+1))
		le.PutUint32(e[smrPeerDataNameSnt:], 1)
	}
	copy(mem[4096+3*smrPeerDataSize:], "fi_shm://22:0:10")
	copy(mem[4096+7*smrPeerDataSize:], "fi_shm://22:0:1")
	assert.Equal(t, 7, o.slotOf([]byte("fi_shm://22:0:1\x00")))
	assert.Equal(t, 3, o.slotOf([]byte("fi_shm://22:0:10")))
	assert.Equal(t, -1, o.slotOf([]byte("fi_shm://22:0:")))
	assert.Equal(t, -1, o.slotOf(nil))
	o.clearHandshake(7)
	for i := 0; i < smrMaxPeers; i++ {
		e := mem[4096+i*smrPeerDataSize:]
		id, sent := int64(le.Uint64(e[smrPeerDataID:])), le.Uint32(e[smrPeerDataNameSnt:])
		if i == 7 {
			assert.Equal(t, int64(-1), id)
			assert.Zero(t, sent)
			continue
		}
		assert.Equal(t, int64(i+1), id, "slot %d", i)
		assert.Equal(t, uint32(1), sent, "slot %d", i)
	}
}
