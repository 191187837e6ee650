package transport

import (
	"encoding/binary"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/completion"
	"github.com/fitransfer/fitransfer/fabric"
)

// sockaddrIn is the raw sockaddr_in of a TCP address, as fi_getname gives.
func sockaddrIn(t *testing.T, addr *net.TCPAddr) []byte {
	t.Helper()
	b := make([]byte, 16)
	binary.LittleEndian.PutUint16(b[0:2], syscall.AF_INET)
	binary.BigEndian.PutUint16(b[2:4], uint16(addr.Port))
	copy(b[4:8], addr.IP.To4())
	return b
}

func TestTCPPeerGoneAfter(t *testing.T) {
	live, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer live.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadName := sockaddrIn(t, dead.Addr().(*net.TCPAddr))
	require.NoError(t, dead.Close()) // nothing listens there now
	liveName := sockaddrIn(t, live.Addr().(*net.TCPAddr))

	canceled := func(provErrno int) error {
		return &completion.Error{Op: completion.Read, Errno: fabric.ErrCanceled, ProvErrno: provErrno}
	}
	notConn := func() error {
		return &completion.Error{Op: completion.Read, Errno: fabric.ErrNotConn, ProvErrno: int(syscall.EPIPE)}
	}
	tests := []struct {
		name   string
		errs   []error
		peer   []byte
		victim bool
		isGone bool
		hint   string // the chunk errors' hint afterwards, when the owner listens
	}{
		{"canceled, nothing listens", []error{canceled(2), canceled(2)}, deadName, false, true, ""},
		{"canceled, the owner listens (a rejected key)", []error{canceled(2)}, liveName, false, false, "rejects an RMA op's key"},
		// rxm's prov_errno is a leftover errno: ENOTCONN there does not
		// mean the owner exited.
		{"canceled with ENOTCONN, the owner listens", []error{canceled(int(syscall.ENOTCONN))}, liveName, false, false, "rejects an RMA op's key"},
		{"canceled with ENOTCONN, nothing listens", []error{canceled(int(syscall.ENOTCONN))}, deadName, false, true, ""},
		{"not connected, nothing listens", []error{notConn()}, deadName, false, true, ""},
		{"not connected after an earlier rejection", []error{notConn()}, liveName, true, false, "rejecting an earlier op's key"},
		{"not only a lost connection", []error{canceled(2), &completion.Error{Errno: fabric.ErrIO}}, deadName, false, false, ""},
		{"no errors", nil, deadName, false, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &completion.Job{Op: completion.Read, PeerName: "peer-x", Errs: tt.errs}
			err := tcpPeerGoneAfter(j, tt.peer, tt.victim)
			if !tt.isGone {
				assert.NoError(t, err)
				for _, e := range tt.errs {
					var ce *completion.Error
					require.ErrorAs(t, e, &ce)
					if tt.hint != "" {
						assert.Contains(t, ce.Hint, tt.hint)
						assert.NotContains(t, ce.Hint, "exited")
					} else {
						assert.Empty(t, ce.Hint)
					}
				}
				return
			}
			var gone *completion.PeerGoneError
			require.ErrorAs(t, err, &gone)
			assert.Contains(t, err.Error(), "peer-x")
			assert.Contains(t, err.Error(), "connection refused")
		})
	}
}

// TestConnDrop: which failures count as victims of an earlier drop.
func TestConnDrop(t *testing.T) {
	const ms = int64(time.Millisecond)
	var d connDrop
	assert.False(t, d.victim(5*ms, 6*ms), "no drop seen")
	d.saw(10 * ms)
	assert.False(t, d.victim(9*ms, 11*ms), "started before the drop: maybe the rejected op")
	assert.True(t, d.victim(11*ms, 12*ms), "started after the drop")
	assert.False(t, d.victim(11*ms, 10*ms+int64(staleConnWindow)), "the window is over")
	d.saw(20 * ms) // an op already in flight at the first drop: the same drop
	assert.Equal(t, 10*ms, d.at.Load())
	d.ok(30 * ms)
	assert.True(t, d.victim(25*ms, 31*ms), "started before the success: it may have met the dead connection")
	assert.False(t, d.victim(35*ms, 36*ms), "started on a working connection: its own rejection")
	d.saw(40 * ms) // after a success: a new drop
	assert.Equal(t, 40*ms, d.at.Load())
	assert.True(t, d.victim(41*ms, 42*ms))
}
