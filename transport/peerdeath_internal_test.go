package transport

import (
	"context"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestVerifierCountsDeaths: the verifier counts a peer that died or left
// once, however many connections it had (a peer verifies on one and
// announces its shm use on another), so that one death costs one shared
// check of the shm endpoint; a registration's look at the pidfds counts a
// process that exited while its connection is still open.
func TestVerifierCountsDeaths(t *testing.T) {
	v := &verifier{conns: map[*net.UnixConn]*verifiedPeer{}}
	v.stop, v.cancel = context.WithCancel(context.Background())
	defer v.cancel()
	conn := func() *net.UnixConn {
		pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		unix.Close(pair[1])
		f := os.NewFile(uintptr(pair[0]), "sock")
		defer f.Close()
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	// A child that has exited and is not reaped yet: its pidfd polls
	// readable, its connection is still open.
	child := exec.Command("true")
	require.NoError(t, child.Start())
	defer child.Wait()
	pidfd, err := unix.PidfdOpen(child.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	_, err = unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 10_000)
	require.NoError(t, err)

	self := os.Getpid()
	verify, announce, exited := conn(), conn(), conn()
	require.True(t, v.track(verify, self))
	require.True(t, v.track(announce, self))
	require.True(t, v.track(exited, child.Process.Pid))

	assert.Equal(t, uint64(1), v.takeDeaths(nil), "the child's pidfd says it exited; this process lives")
	assert.Equal(t, uint64(1), v.takeDeaths(nil), "nothing new")
	assert.Equal(t, uint64(1), v.takeDeaths(exited), "the child's connection ends: counted already")
	assert.Equal(t, uint64(2), v.takeDeaths(verify), "this process leaves")
	assert.Equal(t, uint64(2), v.takeDeaths(announce), "its second connection: the same process")
	v.untrack(verify)
	v.untrack(announce)
	v.untrack(exited)
	assert.Empty(t, v.conns)
}

// TestVerifierBoundsConnections: the verifier serves at most
// maxVerifierConnsPerPID connections of one process at a time (each costs
// the owner a socket, a pidfd and a goroutine): the next is closed at
// once, without the proof, and one comes in once another ended. A process
// of the owner's user that connected without end ran the owner out of
// descriptors (an attacker's review).
func TestVerifierBoundsConnections(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	m, err := New(context.Background(), WithProviders(testenv.RouteMem))
	require.NoError(t, err)
	defer m.Close()
	dial := func() *net.UnixConn {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: verifySocket(m.id), Net: "unixpacket"})
		require.NoError(t, err)
		return c
	}
	// answered reports whether the owner sent its proof (it serves the
	// connection) rather than closing it.
	answered := func(c *net.UnixConn) bool {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		n, err := c.Read(make([]byte, 4096))
		return err == nil && n > 0
	}
	var conns []*net.UnixConn
	for i := range maxVerifierConnsPerPID {
		c := dial()
		defer c.Close()
		require.True(t, answered(c), "connection %d", i)
		conns = append(conns, c)
	}
	over := dial()
	defer over.Close()
	assert.False(t, answered(over), "a connection past the bound was served")

	require.NoError(t, conns[0].Close())
	require.Eventually(t, func() bool {
		c := dial()
		defer c.Close()
		return answered(c)
	}, 10*time.Second, 10*time.Millisecond, "no connection served after one ended")

	// Connections the owner ends itself (it replaced its shm endpoint:
	// dropPeers) no longer count either.
	m.verifier.dropPeers()
	for i := range maxVerifierConnsPerPID {
		c := dial()
		defer c.Close()
		require.True(t, answered(c), "connection %d after the owner dropped its peers", i)
	}
}

// TestLinkToAnOwnerThatDied: an owner verified before (here a child that
// has exited and is not reaped: a zombie), whose link this manager dials
// before it hears of the death, answers no dial: nobody listens on its
// verifier socket, or another process does (the dial ends with another
// failure than no answer, as one whose owner died while it waited for
// the owner's proof). The op fails with ErrPeerGone, naming the process
// and how it is known to be gone, not with "no route" because the link
// failed. Nothing moves. Until 2026-12-07 the second case was ErrNoRoute.
func TestLinkToAnOwnerThatDied(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	for _, socket := range []string{"nobody listens", "another process listens"} {
		t.Run(socket, func(t *testing.T) {
			m, err := New(context.Background(), WithProviders(testenv.RouteMem))
			require.NoError(t, err)
			defer m.Close()
			child := exec.Command("true")
			require.NoError(t, child.Start())
			defer child.Wait()
			pid := child.Process.Pid
			require.Eventually(t, func() bool { gone, _ := proc.Gone(pid); return gone }, 10*time.Second, time.Millisecond,
				"the child never exited")

			// Its verification as it was while it lived, over a connection
			// whose end this manager has not read yet.
			pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
			require.NoError(t, err)
			unix.Close(pair[1])
			f := os.NewFile(uintptr(pair[0]), "verified")
			conn, err := net.FileConn(f)
			f.Close()
			require.NoError(t, err)
			owner, guard := newManagerID(), guardLoc{table: 1 << 20, key: 7}
			if socket == "another process listens" { // this one: its credentials are not the owner's
				ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: verifySocket(owner), Net: "unixpacket"})
				require.NoError(t, err)
				defer ln.Close()
			}
			v := &verification{peer: &sameNodePeer{pid: pid, owner: owner, cma: guard, conn: conn.(*net.UnixConn)}, ready: make(chan struct{})}
			close(v.ready)
			v.done.Store(true)
			m.verified.mu.Lock()
			if m.verified.byID == nil {
				m.verified.byID = map[ID]*verification{}
			}
			m.verified.byID[owner] = v
			m.verified.mu.Unlock()
			b, err := readMemByHand(t, m, owner, pid, guard, 30*time.Second)
			require.ErrorIs(t, err, ErrPeerGone)
			assert.Contains(t, err.Error(), cma.Peer(pid))
			assert.Contains(t, err.Error(), "zombie", "the error says how the owner is known to be gone")
			assert.Equal(t, make([]byte, 64), b, "nothing moved")
		})
	}
}

// readMemByHand reads 64 bytes into a buffer of m's from buffer 1 of
// manager owner, in process pid, over a mem handle built by hand with the
// guard table the owner's proof announces (guard), within d; it returns
// the local bytes and the read's error.
func readMemByHand(t *testing.T, m *Manager, owner ID, pid int, guard guardLoc, d time.Duration) ([]byte, error) {
	t.Helper()
	h := RemoteBuffer{node: m.node, owner: owner, id: 1, n: 64, size: 64, access: mr.ReadWrite, eps: []remoteEP{{
		provider: mem.Name, name: cma.ProcName(pid), base: 1 << 20,
		guard: &guardRef{table: guard.table, key: guard.key, slot: 0, gen: 1},
	}}}
	b, err := mr.Alloc(64)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(b) })
	local, err := m.Register(b, mr.ReadWrite)
	require.NoError(t, err)
	t.Cleanup(func() { _ = local.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return b, m.ReadInto(ctx, local, h)
}
