package transport

import (
	"context"
	"encoding/binary"
	"net"
	"syscall"
	"testing"

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

// TestTCPExplain: a tcp job that failed with cancellations and lost
// connections only is explained by one dial of the peer's endpoint:
// nothing listens (ErrPeerGone), the owner listens and shut the
// connection down under a cancelled op (it refused it: ErrStaleHandle,
// whatever leftover errno prov_errno holds), or the owner listens and
// the op was posted to a connection already lost (no explanation:
// transient).
func TestTCPExplain(t *testing.T) {
	live, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer live.Close()
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadName := sockaddrIn(t, dead.Addr().(*net.TCPAddr))
	require.NoError(t, dead.Close()) // nothing listens there now
	liveName := sockaddrIn(t, live.Addr().(*net.TCPAddr))

	canceled := func(provErrno int) error {
		return &completion.Error{Op: completion.Read, Provider: "tcp;ofi_rxm", Errno: fabric.ErrCanceled, ProvErrno: provErrno}
	}
	notConn := &completion.Error{Op: completion.Read, Provider: "tcp;ofi_rxm", Errno: fabric.ErrNotConn, ProvErrno: int(syscall.EPIPE)}
	tests := []struct {
		name string
		errs []error
		peer []byte
		want error // nil: no explanation
	}{
		{"canceled, nothing listens", []error{canceled(2), canceled(2)}, deadName, ErrPeerGone},
		{"canceled, the owner listens (a refused key)", []error{canceled(2)}, liveName, ErrStaleHandle},
		{"canceled (ENOTCONN), nothing listens", []error{canceled(int(syscall.ENOTCONN))}, deadName, ErrPeerGone},
		{"canceled (ENOTCONN), the owner listens (a refused key)", []error{canceled(int(syscall.ENOTCONN))}, liveName, ErrStaleHandle},
		{"canceled and not connected, the owner listens", []error{canceled(2), notConn}, liveName, ErrStaleHandle},
		{"not connected, nothing listens", []error{notConn}, deadName, ErrPeerGone},
		{"not connected, the owner listens", []error{notConn}, liveName, nil},
		{"not only cancellations", []error{canceled(2), &completion.Error{Errno: fabric.ErrIO}}, deadName, nil},
		{"a timeout", []error{&completion.TimeoutError{Cause: context.DeadlineExceeded}}, deadName, nil},
		{"no errors", nil, deadName, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &completion.Job{Op: completion.Read, PeerName: "peer-x", Errs: tt.errs}
			err := tcpExplain(j, tt.peer)
			if tt.want == nil {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.want)
			for _, other := range []error{ErrPeerGone, ErrStaleHandle} {
				if other != tt.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			if tt.want == ErrPeerGone {
				var gone *completion.PeerGoneError
				require.ErrorAs(t, err, &gone)
				assert.Contains(t, err.Error(), "peer-x")
				assert.Contains(t, err.Error(), "connection refused")
			} else {
				assert.Contains(t, err.Error(), "still listens")
			}
		})
	}
}

// TestNothingListens: a refused dial, and a connection reset at once (a
// listener closing in its process's exit resets what waits in its
// backlog), mean nothing listens; a listener that never accepts (a
// stopped process: the kernel completes the handshake) still listens.
func TestNothingListens(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	assert.True(t, nothingListens(closedAddr), "refused")

	stopped, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer stopped.Close()
	assert.False(t, nothingListens(stopped.Addr().String()), "a listener that does not accept")

	closing, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer closing.Close()
	go func() {
		c, err := closing.Accept()
		if err != nil {
			return
		}
		_ = c.(*net.TCPConn).SetLinger(0) // close with a reset, as a closing listener does
		_ = c.Close()
	}()
	assert.True(t, nothingListens(closing.Addr().String()), "reset right after the dial")
}
