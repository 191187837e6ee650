package libfabric

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/progress"
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
// nothing listens (errclass.ErrPeerGone), the owner listens and shut the
// connection down under a cancelled op (it refused it: errclass.ErrStaleHandle,
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
		return &progress.Error{Op: progress.Read, Provider: "tcp;ofi_rxm", Errno: fabric.ErrCanceled, ProvErrno: provErrno}
	}
	notConn := func() error {
		return &progress.Error{Op: progress.Read, Provider: "tcp;ofi_rxm", Errno: fabric.ErrNotConn, ProvErrno: int(syscall.EPIPE)}
	}
	const rejected, droppedBefore = "rejects an RMA op's key", "rejecting an earlier op's key"
	tests := []struct {
		name   string
		errs   []error
		peer   []byte
		victim bool   // the job met the connection an earlier rejection dropped
		want   error  // nil: no explanation
		hint   string // the chunk errors' hint afterwards ("": unchanged)
		past   bool   // the job's deadline passed: no time to dial the owner
	}{
		{"canceled, nothing listens", []error{canceled(2), canceled(2)}, deadName, false, errclass.ErrPeerGone, "", false},
		{"canceled, the owner listens (a refused key)", []error{canceled(2)}, liveName, false, errclass.ErrStaleHandle, rejected, false},
		// rxm's prov_errno is a leftover errno: ENOTCONN there does not
		// mean the owner exited.
		{"canceled (ENOTCONN), nothing listens", []error{canceled(int(syscall.ENOTCONN))}, deadName, false, errclass.ErrPeerGone, "", false},
		{"canceled (ENOTCONN), the owner listens (a refused key)", []error{canceled(int(syscall.ENOTCONN))}, liveName, false, errclass.ErrStaleHandle, rejected, false},
		{"canceled and not connected, the owner listens", []error{canceled(2), notConn()}, liveName, false, errclass.ErrStaleHandle, rejected, false},
		{"not connected, nothing listens", []error{notConn()}, deadName, false, errclass.ErrPeerGone, "", false},
		{"not connected, the owner listens", []error{notConn()}, liveName, false, nil, rejected, false},
		{"not connected after an earlier rejection", []error{notConn()}, liveName, true, nil, droppedBefore, false},
		{"not only cancellations", []error{canceled(2), &progress.Error{Errno: fabric.ErrIO}}, deadName, false, nil, "", false},
		{"a timeout", []error{&progress.TimeoutError{Cause: context.DeadlineExceeded}}, deadName, false, nil, "", false},
		{"no errors", nil, deadName, false, nil, "", false},
		// Unexplained, such ops had no class and were not retryable
		// (a new user's review): given time, they are posted again.
		{"canceled, past the deadline", []error{canceled(2)}, liveName, false, errclass.ErrTimeout, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := &progress.Job{Op: progress.Read, PeerName: "peer-x", Errs: tt.errs}
			if tt.past {
				j.Deadline = time.Now().Add(-time.Second)
			}
			err := Explain(j, tt.peer, tt.victim)
			for _, e := range tt.errs {
				var ce *progress.Error
				if !errors.As(e, &ce) {
					continue
				}
				if tt.hint != "" {
					assert.Contains(t, ce.Hint, tt.hint)
					assert.NotContains(t, ce.Hint, "exited")
				} else {
					assert.Empty(t, ce.Hint)
				}
			}
			if tt.want == nil {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tt.want)
			for _, other := range []error{errclass.ErrPeerGone, errclass.ErrStaleHandle, errclass.ErrTimeout} {
				if other != tt.want {
					assert.NotErrorIs(t, err, other)
				}
			}
			if tt.want == errclass.ErrPeerGone {
				var gone *progress.PeerGoneError
				require.ErrorAs(t, err, &gone)
				assert.Contains(t, err.Error(), "peer-x")
				assert.Contains(t, err.Error(), "connection refused")
			} else if tt.want == errclass.ErrStaleHandle {
				assert.Contains(t, err.Error(), "still listens")
			} else {
				assert.Contains(t, err.Error(), "deadline came before a dial")
			}
		})
	}
}

// TestOwnerLiveness: a refused dial, and a connection reset while
// ownerLiveness watches it (a listener closing in its process's exit
// resets what waits in its backlog), mean the owner is gone; so does a
// listener that closes before the second dial, aliveRecheck after the
// lost connection. A listener that never accepts (a stopped process: the
// kernel completes the handshake) still listens, and a dial long after
// the lost connection does not wait. Past a request's deadline the owner
// is unknown: the answer was due then.
func TestOwnerLiveness(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closedAddr := closed.Addr().String()
	require.NoError(t, closed.Close())
	assert.Equal(t, ownerGone, ownerLiveness(closedAddr, time.Now(), time.Time{}), "refused")

	stopped, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer stopped.Close()
	start := time.Now()
	assert.Equal(t, ownerListens, ownerLiveness(stopped.Addr().String(), start, time.Time{}), "a listener that does not accept")
	assert.GreaterOrEqual(t, time.Since(start), aliveRecheck, "asked again aliveRecheck after the loss")
	start = time.Now()
	assert.Equal(t, ownerListens, ownerLiveness(stopped.Addr().String(), start.Add(-aliveRecheck), time.Time{}), "long after the loss")
	assert.Less(t, time.Since(start), aliveRecheck, "one dial, no wait")
	// A request's deadline ends the watch: its answer is due then.
	start = time.Now()
	assert.Equal(t, ownerUnknown, ownerLiveness(stopped.Addr().String(), start, start.Add(aliveRecheck/5)), "asked past the request's deadline")
	assert.Equal(t, ownerUnknown, ownerLiveness(stopped.Addr().String(), start.Add(-aliveRecheck), start), "the deadline passed before the dial")

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
	assert.Equal(t, ownerGone, ownerLiveness(closing.Addr().String(), time.Now(), time.Time{}), "reset right after the dial")

	// The owner's connection is accepted and closed without a reset (its
	// process had accepted it), and its listener closes a moment later.
	late, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() {
		c, err := late.Accept()
		if err == nil {
			_ = c.Close()
		}
		time.Sleep(5 * time.Millisecond)
		_ = late.Close()
	}()
	assert.Equal(t, ownerGone, ownerLiveness(late.Addr().String(), time.Now(), time.Time{}), "the listener closed before the second dial")
}

// TestConnDrop: which failures count as victims of an earlier drop.
func TestConnDrop(t *testing.T) {
	const ms = int64(time.Millisecond)
	var d drop
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
