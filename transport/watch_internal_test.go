package transport

import (
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestWatchVerifiedConnection: what the end of a peer's verified
// connection to an owner means. The owner asked to be verified again
// (dropPeers, after it replaced its shm endpoint: announceReverify before
// the end): replaced, not gone, and the owner's old shm address is
// forgotten. The owner's side ended it without a word: gone. This
// manager ended it (reverify, evict): replaced, and shm keeps the address.
// Each way the mem links end.
func TestWatchVerifiedConnection(t *testing.T) {
	for _, tt := range []struct {
		name                   string
		end                    func(p *sameNodePeer, peerSide, ownerSide *net.UnixConn)
		replaced, gone, forgot bool
	}{
		{"the owner asks to be verified again", func(_ *sameNodePeer, _, ownerSide *net.UnixConn) {
			v := &verifier{conns: map[*net.UnixConn]*verifiedPeer{ownerSide: {pid: os.Getpid(), pidfd: -1}}}
			v.dropPeers()
		}, true, false, true},
		{"the owner's side ends it", func(_ *sameNodePeer, _, ownerSide *net.UnixConn) {
			_ = ownerSide.Close()
		}, false, true, true},
		{"this manager ends it", func(p *sameNodePeer, peerSide, _ *net.UnixConn) {
			p.replaced.Store(true)
			_ = peerSide.Close()
		}, true, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peerSide, ownerSide := seqpacketPair(t)
			p := &sameNodePeer{pid: os.Getpid(), conn: peerSide}
			var forgot atomic.Bool
			done := make(chan struct{})
			go func() {
				defer close(done)
				p.watch(peerSide, func(*sameNodePeer) { forgot.Store(true) })
			}()
			tt.end(p, peerSide, ownerSide)
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the watcher did not see the end within 10 s")
			}
			require.Equal(t, tt.replaced, p.replaced.Load(), "replaced")
			require.Equal(t, tt.gone, p.gone.Load(), "gone")
			require.Equal(t, tt.forgot, forgot.Load(), "the shm address forgotten")
			p.memMu.Lock()
			defer p.memMu.Unlock()
			require.True(t, p.memDone, "the mem links ended")
		})
	}
}

// seqpacketPair is a connected pair of unixpacket sockets, as between a
// peer and an owner's verifier.
func seqpacketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestDropPeersIsNoDeath: the connections an owner ends to have its peers
// verify it again are untracked first, so that their end is not counted
// as a peer's death (which would mark the peer's next connections dead
// too).
func TestDropPeersIsNoDeath(t *testing.T) {
	peerSide, ownerSide := seqpacketPair(t)
	v := &verifier{conns: map[*net.UnixConn]*verifiedPeer{ownerSide: {pid: os.Getpid(), pidfd: -1}}}
	v.dropPeers()
	require.Empty(t, v.conns)
	require.Zero(t, v.takeDeaths(ownerSide), "a dropped connection counted as a death")
	var b [1]byte
	n, err := peerSide.Read(b[:])
	require.NoError(t, err)
	require.Equal(t, []byte{announceReverify}, b[:n], "what the peer reads before the end")
}

// TestVerifyReplacedOwnerAgain: an owner whose verification this manager
// or the owner itself ended (replaced) is verified again, and a failure
// of that verification that passes (no answer) is that failure, not
// ErrPeerGone; an owner whose side ended the connection (gone) that no
// longer answers is gone.
func TestVerifyReplacedOwnerAgain(t *testing.T) {
	for _, tt := range []struct {
		name     string
		gone     bool
		wantGone bool
	}{
		{"replaced", false, false},
		{"gone", true, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			owner := newManagerID() // nobody listens for it: verification finds no answer
			old := &sameNodePeer{pid: os.Getpid(), owner: owner}
			old.replaced.Store(!tt.gone)
			old.gone.Store(tt.gone)
			v := &verification{peer: old, ready: make(chan struct{})}
			close(v.ready)
			v.done.Store(true)
			m := &Manager{}
			m.verified.byID = map[ID]*verification{owner: v}
			_, err := m.sameNodePeer(testTimes(), owner)
			require.Error(t, err)
			if tt.wantGone {
				require.ErrorIs(t, err, ErrPeerGone)
				return
			}
			require.NotErrorIs(t, err, ErrPeerGone)
			require.ErrorIs(t, err, errNoAnswer)
			m.verified.mu.Lock()
			again := m.verified.byID[owner]
			m.verified.mu.Unlock()
			require.NotSame(t, v, again, "the replaced verification is still the table's")
			require.False(t, again.expires.IsZero(), "a failure that passes must expire")
		})
	}
}
