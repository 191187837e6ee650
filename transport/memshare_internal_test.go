package transport

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// TestMemLinkEndsOutOfStep: an owner that answers a map request after the
// initiator gave up on it leaves the connection out of step. The link
// ends there, so that the next request never reads the late answer as its
// own (buffer 1's file taken for buffer 2's).
func TestMemLinkEndsOutOfStep(t *testing.T) {
	const size = 4096
	bufA, err := mr.Alloc(size)
	require.NoError(t, err)
	defer mr.Free(bufA)
	bufB, err := mr.Alloc(size)
	require.NoError(t, err)
	defer mr.Free(bufB)
	copy(bufA, "AAAA buffer 1")
	copy(bufB, "BBBB buffer 2")
	ini, own := seqpacketPair(t)
	go func() { // the owner answers in order, the first answer late
		b := make([]byte, 64)
		for i := 0; ; i++ {
			n, err := own.Read(b)
			if err != nil {
				return
			}
			buf := bufA
			if i > 0 {
				buf = bufB
			}
			if i == 0 {
				time.Sleep(verifyTimeout + 300*time.Millisecond) // the slow owner this test is about
			}
			fd, _, _ := mr.File(buf, false)
			_ = memAnswer(own, memOK, "", size, b[4:24:n], fd)
			unix.Close(fd)
		}
	}()
	l := &memLink{owner: &sameNodePeer{pid: 1}, conn: ini, pidfd: -1, maps: map[uint64]*memMap{}}
	ep := func(slot uint32) *remoteEP { return &remoteEP{key: 7, base: 8, guard: &guardRef{slot: slot, gen: 1}} }
	_, err = l.get(testTimes(), &RemoteBuffer{id: 1, size: size, n: size, access: mr.ReadWrite}, ep(1))
	require.Error(t, err, "the answer came after the deadline")
	// The owner lives: nothing moved, and the next op dials again.
	require.NotErrorIs(t, err, ErrPeerGone)
	require.True(t, Retryable(err), "%v", err)
	mm, err := l.get(testTimes(), &RemoteBuffer{id: 2, size: size, n: size, access: mr.ReadWrite}, ep(2))
	if err == nil {
		require.Equal(t, "BBBB buffer 2", string(mm.b[:13]), "buffer 2's mapping is another buffer's file")
	}
	require.True(t, l.done.Load(), "the link ended when it fell out of step")
}

// TestMemWaitWhilePeerLeaves: Close's wait for one peer's mark goes on
// while another peer's connection ends and its use page is released.
func TestMemWaitWhilePeerLeaves(t *testing.T) {
	newPeer := func() *memPeer {
		page, err := mr.Alloc(useSlots * 4)
		require.NoError(t, err)
		return &memPeer{pid: os.Getpid(), pidfd: -1, page: page, uses: mem.UsesOf(page)}
	}
	a, b := newPeer(), newPeer()
	ps := &memPeers{list: []*memPeer{a, b}}
	const slot = 5
	a.uses.Mark(slot)
	b.uses.Mark(slot) // wait reads b's page after a's
	done := make(chan []int)
	go func() { done <- ps.wait(slot, time.Now().Add(time.Minute)) }()
	b.uses.Leave(slot)
	ps.end(b) // b, idle, leaves: its page is released while wait runs
	a.uses.Leave(slot)
	require.Empty(t, <-done)
	ps.close()
}

// TestMemCopyAfterLinkEnded: a copy whose link ended before its use mark
// moves nothing and leaves its mark, failing by why the link ended: this
// manager closes (ErrClosed), the owner is gone (PeerGoneError), or else
// another op's request failed while the owner lives, which is not the
// owner's death.
func TestMemCopyAfterLinkEnded(t *testing.T) {
	for _, tt := range []struct {
		name          string
		done, down    bool
		gone          bool
		closed, ended bool // the error wraps ErrClosed; it is a memLinkEnded
	}{
		{name: "link up"},
		{name: "another op's request failed", done: true, ended: true},
		{name: "the owner is gone", done: true, gone: true},
		{name: "this manager closes", done: true, down: true, closed: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peer := &sameNodePeer{pid: os.Getpid()}
			peer.gone.Store(tt.gone)
			g := &guardRef{slot: 3, gen: 5}
			l := &memLink{owner: peer, pidfd: -1, gens: make([]uint64, 8), uses: make(mem.Uses, 8)}
			l.gens[g.slot] = g.gen
			l.done.Store(tt.done)
			m := &Manager{}
			m.down.Store(tt.down)
			local, remote := make([]byte, 8), []byte("12345678")
			err := m.memCopy(route.Limit{}, progress.Read, local, remote, l, g, peer, 1)
			require.False(t, l.uses.InUse(g.slot), "the copy left its mark")
			var ended *memLinkEnded
			var gone *progress.PeerGoneError
			switch {
			case !tt.done:
				require.NoError(t, err)
				require.Equal(t, remote, local)
				return
			case tt.closed:
				require.ErrorIs(t, err, ErrClosed)
			case tt.ended:
				require.ErrorAs(t, err, &ended)
				require.False(t, errors.As(err, &gone), "a live owner reported gone: %v", err)
				// Nothing moved and the next op dials again: the request,
				// as the full path returns it, may be made again.
				require.True(t, Retryable(&TransferError{Op: "read", Ops: 1, Failed: 1, Errs: []error{err}}), "%v", err)
			default:
				require.ErrorAs(t, err, &gone)
			}
			require.Equal(t, make([]byte, 8), local, "a copy moved bytes over an ended link")
		})
	}
}

// TestEndedPeerKeptWhileItMapsItsPage: an owner whose peer's connection
// ended keeps reading the peer's use page, for Buffer.Close's waits,
// while the peer process lives and maps it, even with no op marked: the
// end does not tell that the peer stopped using the link (the owner ends
// it itself when it replaces its shm endpoint, dropPeers), and an op
// that marked the page after the owner let it go copied through a
// Close that no longer looked (from an attacker's review). It lets the
// page go once the process unmaps it. This process stands in for the
// peer, and another of its mappings for the page the peer maps.
func TestEndedPeerKeptWhileItMapsItsPage(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem) // memfds a peer maps
	mapped, err := mr.Alloc(4096)             // the peer's mapping of its use page
	require.NoError(t, err)
	fd, ok, err := mr.File(mapped, false)
	require.NoError(t, err)
	require.True(t, ok)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	_ = unix.Close(fd)

	page, err := mr.Alloc(useSlots * 4)
	require.NoError(t, err)
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	require.NoError(t, err)
	p := &memPeer{pid: os.Getpid(), pidfd: pidfd, page: page, uses: mem.UsesOf(page), dev: st.Dev, ino: st.Ino}
	ps := &memPeers{list: []*memPeer{p}}
	ps.end(p)
	require.False(t, p.released, "the page of a live peer that maps it was let go at its connection's end")
	require.Len(t, ps.ended, 1)

	require.NoError(t, mr.Free(mapped))
	ps.mu.Lock()
	ps.prune()
	ps.mu.Unlock()
	require.True(t, p.released, "kept after the peer unmapped its page")
	require.Empty(t, ps.ended)
}

// TestEndedPeerWithMarksOnAnUnmappedPage: a mark on a use page its peer
// no longer maps counts for nothing (no op of the peer's can clear it, and
// a peer frees its page only once its ops ended): the page goes at the
// connection's end. Kept, a process of the owner's user that marked,
// unmapped and reconnected, over and over, had the owner hold a page and
// a pidfd per round until its descriptors ran out (an attacker's review).
// And the owner hands out no more pages than maxMemPeers, the kept ones
// counted.
func TestEndedPeerWithMarksOnAnUnmappedPage(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	page, err := mr.Alloc(useSlots * 4)
	require.NoError(t, err)
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	require.NoError(t, err)
	// A file this process does not map stands for the page the peer
	// unmapped.
	f, err := os.CreateTemp(t.TempDir(), "unmapped")
	require.NoError(t, err)
	defer f.Close()
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	p := &memPeer{pid: os.Getpid(), pidfd: pidfd, page: page, uses: mem.UsesOf(page), dev: st.Dev, ino: st.Ino}
	p.uses.Mark(7)
	require.True(t, p.uses.InUse(7))
	ps := &memPeers{list: []*memPeer{p}}
	ps.end(p)
	require.True(t, p.released, "a marked page its live peer no longer maps was kept")
	require.Empty(t, ps.ended)

	// Peers that ended and still map their pages count toward the bound.
	mapped, err := mr.Alloc(4096)
	require.NoError(t, err)
	defer func() { _ = mr.Free(mapped) }()
	fd, ok, err := mr.File(mapped, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, unix.Fstat(fd, &st))
	_ = unix.Close(fd)
	kept := &memPeer{pid: os.Getpid(), pidfd: -1, dev: st.Dev, ino: st.Ino, released: true}
	ps = &memPeers{}
	for range maxMemPeers - 1 {
		ps.ended = append(ps.ended, &memPeer{pid: os.Getpid(), pidfd: -1, dev: st.Dev, ino: st.Ino})
	}
	require.False(t, ps.full())
	ps.list = append(ps.list, kept)
	require.True(t, ps.full(), "kept pages count")
}
