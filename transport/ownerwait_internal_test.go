package transport

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/mr"
)

// limits are a request's limits for the tests below: a deadline 200 ms
// away, or a context canceled by then.
func limits(t *testing.T, canceled bool) *reqTimes {
	var ctx context.Context
	var cancel context.CancelFunc
	if canceled {
		ctx, cancel = context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel) // the caller's cancel, mid-wait
	} else {
		ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	}
	t.Cleanup(cancel)
	return &reqTimes{ctx: ctx, timeout: DefaultTimeout}
}

// requireGaveUp checks that a request gave up on an owner's answer at its
// limits (an *awaitError of their class), well before verifyTimeout.
func requireGaveUp(t *testing.T, err error, canceled bool, took time.Duration) {
	t.Helper()
	var ae *awaitError
	require.ErrorAs(t, err, &ae)
	if canceled {
		require.ErrorIs(t, err, context.Canceled)
		require.NotErrorIs(t, err, ErrTimeout, "a cancel is no timeout")
	} else {
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, ErrTimeout)
	}
	require.Less(t, took, verifyTimeout, "the wait ends at the request's limits, not the handshake's")
}

// TestMemLinkDialWithinLimits: a request waits for the mem link's setup
// only within its limits, toward an owner's socket that takes the
// connection and never answers; the dial goes on without it and ends by
// its own bound, a timeout. The next request dials again and waits within
// its own limits: it ends as its own timeout (retryable), not with the
// failure of the dial before it (until 2026-12-07 that failure stood for a
// second, and the request's error was ErrNoRoute, final).
func TestMemLinkDialWithinLimits(t *testing.T) {
	for _, canceled := range []bool{false, true} {
		t.Run(map[bool]string{false: "deadline", true: "cancel"}[canceled], func(t *testing.T) {
			owner := newManagerID()
			ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: verifySocket(owner), Net: "unixpacket"})
			require.NoError(t, err)
			defer ln.Close() // connections wait in its backlog, unanswered
			p := &sameNodePeer{pid: os.Getpid(), owner: owner}
			start := time.Now()
			_, err = p.memLink(limits(t, canceled))
			requireGaveUp(t, err, canceled, time.Since(start))

			p.memMu.Lock()
			dialed := p.dialed
			p.memMu.Unlock()
			select {
			case <-dialed:
			case <-time.After(3 * verifyTimeout):
				t.Fatal("the dial never ended")
			}
			p.memMu.Lock()
			dials := p.linkDials
			var ne net.Error
			require.ErrorAs(t, p.linkErr, &ne)
			require.True(t, ne.Timeout(), "the dial's failure: %v", p.linkErr)
			p.memMu.Unlock()
			start = time.Now()
			_, err = p.memLink(limits(t, canceled))
			requireGaveUp(t, err, canceled, time.Since(start))
			p.memMu.Lock()
			defer p.memMu.Unlock()
			require.Equal(t, dials+1, p.linkDials, "dialed again")
		})
	}
}

// TestMemLinkDialAgainDoesNotSpin: an owner whose queue of connections is
// full refuses a connection at once (EAGAIN, which Go counts as a
// timeout). A request dials its link again only verifyTimeout after the
// last dial began, not in a loop, and gets its error at its limits.
func TestMemLinkDialAgainDoesNotSpin(t *testing.T) {
	owner := fullQueue(t)
	p := &sameNodePeer{pid: os.Getpid(), owner: owner}
	start := time.Now()
	_, err := p.memLink(limits(t, false))
	requireGaveUp(t, err, false, time.Since(start))
	p.memMu.Lock()
	defer p.memMu.Unlock()
	require.Equal(t, 1, p.linkDials, "dials within 200 ms")
}

// TestMapAskWithinLimits: a request waits for the owner's answer for a
// buffer only within its limits, whether its own question goes
// unanswered or another op's holds the link. The link stays: the answer
// that comes late is skipped, and the next question gets its own (buffer
// 2's file, not buffer 1's), even when it echoes alike (the same buffer,
// slot and generation: a handle altered in its key).
func TestMapAskWithinLimits(t *testing.T) {
	const size = 4096
	ep := func(slot uint32, key uint64) *remoteEP {
		return &remoteEP{key: key, base: 8, guard: &guardRef{slot: slot, gen: 1}}
	}
	rb := func(id uint64) *RemoteBuffer { return &RemoteBuffer{id: id, size: size, n: size, access: mr.ReadWrite} }
	for _, tc := range []struct {
		name     string
		canceled bool
		alike    bool // the next question echoes as the late one
	}{{"deadline", false, false}, {"cancel", true, false}, {"deadline/echoed alike", false, true}} {
		canceled, name := tc.canceled, tc.name
		t.Run(name+"/answered late", func(t *testing.T) {
			bufs := [2][]byte{}
			for i := range bufs {
				b, err := mr.Alloc(size)
				require.NoError(t, err)
				t.Cleanup(func() { _ = mr.Free(b) })
				copy(b, fmt.Sprintf("buffer %d", i+1))
				bufs[i] = b
			}
			ini, own := seqpacketPair(t)
			release := make(chan struct{})
			go func() { // the owner answers in order, the first answer once released
				b := make([]byte, 64)
				for i := 0; i < 2; i++ {
					n, err := own.Read(b)
					if err != nil {
						return
					}
					if i == 0 {
						<-release
					}
					fd, _, _ := mr.File(bufs[i], false)
					_ = memAnswer(own, memOK, "", size, b[4:24:n], fd)
					_ = unix.Close(fd)
				}
			}()
			l := &memLink{owner: &sameNodePeer{pid: 1}, conn: ini, pidfd: -1, maps: map[uint64]*memMap{},
				gens: make([]uint64, 8)}
			start := time.Now()
			_, err := l.get(limits(t, canceled), rb(1), ep(1, 7))
			requireGaveUp(t, err, canceled, time.Since(start))
			require.False(t, l.done.Load(), "a request's own limits do not end the link")
			close(release)
			next, nextEP := rb(2), ep(2, 7)
			if tc.alike {
				next, nextEP = rb(1), ep(1, 9)
			}
			mm, err := l.get(testTimes(), next, nextEP)
			require.NoError(t, err)
			require.Equal(t, "buffer 2", string(mm.b[:8]), "buffer 2's mapping is another buffer's file")
			mm.unref()
			require.False(t, l.done.Load())
		})
		t.Run(name+"/question not sent", func(t *testing.T) {
			b, err := mr.Alloc(size)
			require.NoError(t, err)
			t.Cleanup(func() { _ = mr.Free(b) })
			copy(b, "buffer 1")
			ini, own := seqpacketPair(t)
			// The owner reads nothing yet: the socket fills, and the
			// question cannot go out before the request's limits.
			filler := make([]byte, 64)
			fills := 0
			for {
				_ = ini.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
				if _, err := ini.Write(filler); err != nil {
					break
				}
				fills++
			}
			l := &memLink{owner: &sameNodePeer{pid: 1}, conn: ini, pidfd: -1, maps: map[uint64]*memMap{},
				gens: make([]uint64, 8)}
			start := time.Now()
			_, err = l.get(limits(t, canceled), rb(1), ep(1, 7))
			requireGaveUp(t, err, canceled, time.Since(start))
			require.False(t, l.done.Load(), "a question that never went out does not end the link")
			require.Zero(t, l.late, "no answer is owed to a question that never went out")
			go func() { // the owner reads the filler, then answers the next question
				r := make([]byte, 64)
				for i := 0; i < fills; i++ {
					if _, err := own.Read(r); err != nil {
						return
					}
				}
				n, err := own.Read(r)
				if err != nil {
					return
				}
				fd, _, _ := mr.File(b, false)
				_ = memAnswer(own, memOK, "", size, r[4:24:n], fd)
				_ = unix.Close(fd)
			}()
			mm, err := l.get(testTimes(), rb(1), ep(1, 7))
			require.NoError(t, err)
			require.Equal(t, "buffer 1", string(mm.b[:8]))
			mm.unref()
		})
		t.Run(name+"/link busy", func(t *testing.T) {
			ini, _ := seqpacketPair(t)
			l := &memLink{owner: &sameNodePeer{pid: 1}, conn: ini, pidfd: -1, maps: map[uint64]*memMap{}}
			l.mu.Lock() // another op's question, unanswered
			defer l.mu.Unlock()
			start := time.Now()
			_, err := l.get(limits(t, canceled), rb(1), ep(1, 7))
			requireGaveUp(t, err, canceled, time.Since(start))
			require.False(t, l.done.Load(), "the other op's question is not this one's to end")
		})
	}
}

// fullQueue is a new owner ID whose socket listens with its queue of
// connections full: it refuses the next at once (EAGAIN, which Go counts
// as a timeout).
func fullQueue(t *testing.T) ID {
	owner := newManagerID()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Close(fd) })
	require.NoError(t, unix.Bind(fd, &unix.SockaddrUnix{Name: verifySocket(owner)}))
	require.NoError(t, unix.Listen(fd, 0)) // one connection waits, the next is refused
	for i := 0; ; i++ {
		require.Less(t, i, 16, "the owner's queue never filled")
		c, err := net.Dial("unixpacket", verifySocket(owner))
		if err != nil {
			return owner
		}
		t.Cleanup(func() { _ = c.Close() })
	}
}

// TestVerifyAgainDoesNotSpin: an owner whose queue of connections is full
// refuses a connection at once (EAGAIN, which Go counts as a timeout). A
// request verifies it again only verifyTimeout after the last try began,
// not in a loop, and gets its error at its limits.
func TestVerifyAgainDoesNotSpin(t *testing.T) {
	owner := fullQueue(t)
	m := &Manager{}
	start := time.Now()
	_, err := m.sameNodePeer(limits(t, false), owner)
	requireGaveUp(t, err, false, time.Since(start))
	require.LessOrEqual(t, m.verified.runs.Load(), uint64(2), "verifications run within 200 ms")
}

// TestMemLinkWaitHearsTheRouteEnd: a request that waits for the mem
// link's dial, the one under way (an owner's socket that takes the
// connection and never answers) or the next one (an owner whose queue of
// connections is full), hears the route's end: the owner gone
// (ErrPeerGone, final) or verified again by this manager (memLinkEnded,
// the new verification's route), not its own timeout. Its limits (1.5 s)
// end before the dial's (verifyTimeout): until 2026-12-07 it waited them
// out and got ErrTimeout.
func TestMemLinkWaitHearsTheRouteEnd(t *testing.T) {
	for _, wait := range []string{"the dial under way", "the next dial"} {
		for _, end := range []string{"owner gone", "verified again"} {
			t.Run(wait+"/"+end, func(t *testing.T) {
				var owner ID
				if wait == "the next dial" {
					owner = fullQueue(t)
				} else {
					owner = newManagerID()
					ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: verifySocket(owner), Net: "unixpacket"})
					require.NoError(t, err)
					t.Cleanup(func() { _ = ln.Close() }) // connections wait in its backlog, unanswered
				}
				p := &sameNodePeer{pid: os.Getpid(), owner: owner}
				ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
				defer cancel()
				res := make(chan error, 1)
				go func() {
					_, err := p.memLink(&reqTimes{ctx: ctx, timeout: DefaultTimeout})
					res <- err
				}()
				require.Eventually(t, func() bool { // the request waits for a dial
					p.memMu.Lock()
					defer p.memMu.Unlock()
					if wait == "the next dial" {
						return p.linkWaits == 1
					}
					return p.dialing
				}, 10*time.Second, time.Millisecond)
				if end == "verified again" {
					p.replaced.Store(true)
				} else {
					p.gone.Store(true)
				}
				p.closeMem() // as watch does
				var err error
				select {
				case err = <-res:
				case <-time.After(10 * time.Second):
					t.Fatal("the request never returned")
				}
				require.NotErrorIs(t, err, ErrTimeout, "it waited out its limits")
				if end == "verified again" {
					var le *memLinkEnded
					require.ErrorAs(t, err, &le)
				} else {
					require.ErrorIs(t, err, ErrPeerGone)
				}
			})
		}
	}
}
