package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestCloseWithOpsInFlight: a transfer times out against an owner that
// does not progress, leaving ops in flight in libfabric; then the buffer
// and the manager are closed. The buffer's Close must not report the
// memory free while those ops may still use it (it waits the manager's
// timeout, then returns an *InUseError); the manager's Close must return
// nil (no endpoint is stuck inside libfabric), without crashing the
// process; and a new manager works with the owner once it runs again.
// Where the transfer completes with the owner stopped, or times out in
// its handle check before any op used the buffer, nothing is in flight
// and the buffer's Close returns nil.
func TestCloseWithOpsInFlight(t *testing.T) {
	const timeout = time.Second
	for _, prov := range providers {
		for _, op := range []string{"read", "write"} {
			t.Run(prov+"/"+op, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				want := expect(t, prov).stoppedBig
				owner := testpeer.Start(t, prov)
				h := owner.Register(big, mr.ReadWrite, 3)
				m, err := transport.New(context.Background(), transport.WithProviders(prov), transport.WithTimeout(timeout))
				require.NoError(t, err)
				mem, err := mr.Alloc(big)
				require.NoError(t, err)
				defer mr.Free(mem)
				defer m.Close() // before the memory goes, whatever happens
				local, err := m.Register(mem, mr.ReadWrite)
				require.NoError(t, err)
				setup, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				require.NoError(t, transfer(setup, m, op, local, h)) // connected

				owner.Stop()
				// A deadline of its own, so that a route that needs no
				// owner has the time to copy 64 MiB on a busy machine;
				// the buffer's Close waits the manager's timeout.
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				xferErr := transfer(ctx, m, op, local, h)
				t.Logf("with the owner stopped: %v", xferErr)
				start := time.Now()
				err = local.Close()
				switch want {
				case completes:
					require.NoError(t, xferErr, "%s needs no owner progress", prov)
					require.NoError(t, err, "nothing in flight")
				case checkTimesOut:
					var te *transport.TransferError
					require.ErrorAs(t, xferErr, &te)
					require.Equal(t, "handle check", te.Op, "%v", xferErr)
					require.ErrorIs(t, xferErr, transport.ErrTimeout)
					require.NoError(t, err, "no op used the buffer")
				case opsTimeOut:
					var te *transport.TransferError
					require.ErrorAs(t, xferErr, &te)
					require.Equal(t, op, te.Op, "%v", xferErr)
					require.ErrorIs(t, xferErr, transport.ErrTimeout)
					var inUse *transport.InUseError
					require.ErrorAs(t, err, &inUse, "ops of the timed-out transfer are still in flight")
					assert.Equal(t, 1, inUse.Transfers)
					assert.Equal(t, timeout, inUse.Waited)
					assert.Contains(t, err.Error(), "do not free or reuse the memory")
					t.Logf("buffer Close: %v", err)
				}
				closeErr := m.Close()
				t.Logf("Close after %v: %v", time.Since(start).Round(time.Millisecond), closeErr)
				assert.NoError(t, closeErr, "no endpoint is stuck inside libfabric")
				assert.Less(t, time.Since(start), 15*time.Second)
				owner.Continue()

				m2, err := transport.New(context.Background(), transport.WithProviders(prov))
				require.NoError(t, err)
				defer m2.Close()
				l2, err := m2.Register(mem[:4096], 0) // local only: part of an allocation, which the mem route does not share
				require.NoError(t, err)
				small, _ := h.Slice(0, 4096)
				require.NoError(t, transfer(setup, m2, op, l2, small), "a new manager works with the owner")
				require.NoError(t, m2.Close())
			})
		}
	}
}

// TestCloseStopsPeers holds Buffer.Close's promise where a peer copies
// without the owner's provider: on the mem route (a mapping of the
// owner's memory), on cma (process_vm_writev), and on libfabric 1.x's
// shm, which copies with process_vm_writev inside fi_write. Nothing but
// fitransfer's use-page protocol stops such a copy: after Close
// returns, no peer op writes that memory. Peer goroutines write 8 MiB
// patterns to the owner's buffers without pause while the owner closes
// them one by one and, the moment each Close returns, fills the buffer
// with a pattern of its own; the writers go on until each has failed on
// every closed buffer. Every owner's pattern must be intact, and every
// write must have returned nil or a stale handle. (libfabric 2.x's shm
// is not here: its owner copies, in its own progress, and Close closes
// the registration there; TestCloseEndsShmOpsInFlight covers the chunks
// it copies over several rounds.)
func TestCloseStopsPeers(t *testing.T) {
	routes := []string{testenv.RouteMem, testenv.RouteCMA}
	if fabric.RuntimeVersion().Major() == 1 {
		routes = append(routes, testenv.RouteSHM)
	}
	for _, rt := range routes {
		t.Run(rt, func(t *testing.T) { closeStopsPeers(t, rt) })
	}
	// An owner that shares no memory (FITRANSFER_MEM=0, or yama above 0)
	// still hands out the link its Close counts the copies through:
	// without it they ran unmarked, and a data path review saw late
	// pieces land in a new buffer at the same address.
	for _, rt := range routes[1:] {
		t.Run(rt+", the owner's memory not shared", func(t *testing.T) {
			t.Setenv(mr.ShareEnv, "0") // the owner's: this process read its own already
			closeStopsPeers(t, rt)
		})
	}
}

func closeStopsPeers(t *testing.T, rt string) {
	testenv.RequireRoute(t, rt)
	const (
		size    = 8 << 20 // two pieces of a copy: a write spans a Close
		buffers = 8
		writers = 3
		rounds  = 6
	)
	owner := testpeer.Start(t, rt)
	m := newManager(t, transport.WithProviders(rt))
	locals := make([]*transport.Buffer, writers)
	for i := range locals {
		b, mem := register(t, m, size, 0)
		testpeer.Fill(mem, uint64(1000+i))
		locals[i] = b
	}
	next := 0 // the owner's buffer index
	if rt != testenv.RouteMem {
		// The route to the owner waits for this manager's use page there,
		// through which the owner's Close waits for the copies.
		h := owner.Register(4096, mr.ReadWrite, 1)
		var reason string
		require.Eventually(t, func() bool {
			r, err := m.Route(h)
			reason = r.Backend + ": " + r.Reason
			return err == nil && strings.Contains(r.Reason, "its Close waits for these copies")
		}, 30*time.Second, time.Millisecond, "the route never said that the owner's Close waits for the copies: %s", reason)
		owner.CloseBuf(0)
		next = 1
	}
	for round := 0; round < rounds; round++ {
		handles := make([]transport.RemoteBuffer, buffers)
		for i := range handles {
			handles[i] = owner.Register(size, mr.ReadWrite, uint64(round*buffers+i))
		}
		first := next
		next += buffers
		var closedMu sync.Mutex
		closed := map[int]bool{}
		var wg sync.WaitGroup
		failures := make(chan string, writers*buffers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				refused := map[int]bool{} // buffers this writer saw closed
				for k := w; len(refused) < buffers; k++ {
					i := k % buffers
					closedMu.Lock()
					wasClosed := closed[i]
					closedMu.Unlock()
					err := m.WriteFrom(context.Background(), handles[i], locals[w])
					switch {
					case err == nil && wasClosed:
						failures <- fmt.Sprintf("a write to buffer %d returned nil after its Close returned", i)
						return
					case err == nil:
					case errors.Is(err, transport.ErrStaleHandle):
						refused[i] = true
					default:
						failures <- fmt.Sprintf("write to buffer %d: %v (not a stale handle)", i, err)
						return
					}
				}
			}()
		}
		for i := range handles {
			require.NoError(t, owner.CloseFill(first+i, uint64(9000+round*buffers+i)))
			closedMu.Lock()
			closed[i] = true
			closedMu.Unlock()
		}
		wg.Wait()
		close(failures)
		for f := range failures {
			t.Error(f)
		}
		for i := range handles {
			want := testpeer.Sum(testpeer.Pattern(size, uint64(9000+round*buffers+i)))
			require.Equal(t, want, owner.Sum(first+i, 0, size), "round %d: buffer %d was written after its Close returned", round, i)
		}
	}
}

// TestCloseStopsCMAPeers: a peer's long write over cma (a write-only
// buffer, which the mem route does not share) into memory this process
// registered. The owner closes the buffer while the write is under way
// and, the moment Close returns, notes which pages the write has not
// reached (a page's first word is still zero). The peer's copy is marked
// in its use page (its mem link to this process is up: the test waits
// for its Route to say so), so Close waits for the piece in flight, and
// the peer sees the new generation before the next: no page lands after
// Close returned, and the write fails with a stale handle.
func TestCloseStopsCMAPeers(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteCMA)
	const size = 256 << 20 // 64 pieces: tens of milliseconds of copying
	m := newManager(t, transport.WithProviders(testenv.RouteCMA))
	peer := testpeer.Start(t, testenv.RouteCMA)
	peer.Register(size, 0, 77) // the peer's source
	mem, err := mr.Alloc(size)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(mem) })
	b, err := m.Register(mem, mr.RemoteWrite)
	require.NoError(t, err)
	err = closeUnderPeerWrite(t, peer, b, mem, "its Close waits for these copies")
	assert.Contains(t, err.Error(), "stale or altered handle")
	assert.Contains(t, err.Error(), "closed by its owner")
}

// closeUnderPeerWrite waits until peer's Route toward b says want ("":
// no wait, the write is the peer's first op toward this process), has
// peer write all of b (from its buffer 0), closes b once the first bytes
// arrived and, the moment Close returns, notes which pages the write has
// not reached (a page's first word is still zero: the peer's pattern
// has none). It asserts that none of them is written later and that the
// write failed, and returns its error.
func closeUnderPeerWrite(t *testing.T, peer *testpeer.Peer, b *transport.Buffer, mem []byte, want string) error {
	t.Helper()
	if want != "" {
		var rt string
		require.Eventually(t, func() bool {
			rt = peer.Route(b.Remote())
			return strings.Contains(rt, want)
		}, 30*time.Second, time.Millisecond, "the peer's route never said %q: %s", want, rt)
	}
	firstWord := func(page int) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[page*4096]))) }
	untouched := make([]bool, len(mem)/4096)
	wrote := make(chan error, 1)
	go func() { wrote <- peer.Transfer("write", 0, b.Remote()) }()
	require.Eventually(t, func() bool { return firstWord(0) != 0 },
		30*time.Second, 10*time.Microsecond, "the peer's write did not begin")
	require.NoError(t, b.Close())
	// One load per page, ahead of a copy in flight (a page in about a
	// tenth of the time the kernel takes to copy one).
	for p := range untouched {
		untouched[p] = firstWord(p) == 0
	}
	require.True(t, untouched[len(untouched)-1], "the write ended before Close returned: the test proves nothing")
	err := <-wrote
	require.Error(t, err, "the peer's write returned nil, though its buffer was closed under it")
	t.Logf("peer: %v", err)
	late := 0
	for p, u := range untouched {
		if u && firstWord(p) != 0 {
			late++
		}
	}
	assert.Zero(t, late, "pages written after Close returned")
	return err
}

// TestCloseStopsCMAPeersOfAllocBuffers: the same with a Manager.Alloc
// buffer, whose Close also unmaps the memory: the peer's write fails
// with a stale handle, whether it saw the new generation before a piece
// or its piece found the memory gone (EFAULT).
func TestCloseStopsCMAPeersOfAllocBuffers(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteCMA)
	const size = 256 << 20
	m := newManager(t, transport.WithProviders(testenv.RouteCMA))
	peer := testpeer.Start(t, testenv.RouteCMA)
	peer.Register(size, 0, 77)
	for i := 0; i < 3; i++ {
		b, err := m.Alloc(size, mr.RemoteWrite)
		require.NoError(t, err)
		mem := b.Bytes()
		wrote := make(chan error, 1)
		go func() { wrote <- peer.Transfer("write", 0, b.Remote()) }()
		require.Eventually(t, func() bool { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != 0 },
			30*time.Second, 10*time.Microsecond, "the peer's write did not begin")
		require.Zero(t, atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[size-8]))), "the write ended before Close: the test proves nothing")
		require.NoError(t, b.Close())
		err = <-wrote
		require.Error(t, err, "the peer's write returned nil, though Close stopped it")
		assert.Contains(t, err.Error(), "stale or altered handle")
		assert.Contains(t, err.Error(), "closed by its owner")
		t.Logf("peer: %v", err)
	}
}

// TestCloseWaitsOnlyForItsOwnCopies: a request of two cma ops, a small
// write to one owner's buffer, then a long read from another owner. The
// first owner closes its buffer while the read copies: its Close waits
// for the write's copy only, not for the rest of the request, so it
// returns while the read is still under way: its last bytes have not
// arrived. (Marks held until the end of the request made that Close wait
// for the whole read.)
func TestCloseWaitsOnlyForItsOwnCopies(t *testing.T) {
	closeWaitsOnlyForItsOwn(t, testenv.RouteCMA, false)
}

// TestCloseWaitsOnlyForItsOwnShmParts: the same over shm, the long read
// first. A request waits for its ops in order and releases each op's
// Xfer after the ones before it: a part's mark held until that release
// made the write's owner's Close wait for the whole read. The mark ends
// when the progress loop is done with the part.
func TestCloseWaitsOnlyForItsOwnShmParts(t *testing.T) {
	closeWaitsOnlyForItsOwn(t, testenv.RouteSHM, true)
}

// closeWaitsOnlyForItsOwn runs one request over rt of a 4 KiB write to
// one owner and a 256 MiB read from another (the read first when
// readFirst); once the write landed and the read began, the write's
// owner closes its buffer, and the read must not have ended by then.
func closeWaitsOnlyForItsOwn(t *testing.T, rt string, readFirst bool) {
	testenv.RequireRoute(t, rt)
	const size = 256 << 20 // tens of milliseconds of copying
	p := testpeer.Start(t, rt)
	q := testpeer.Start(t, rt)
	small := p.Register(4096, mr.RemoteWrite, 1)
	big := q.Register(size, mr.RemoteRead, 77)
	m := newManager(t, transport.WithProviders(rt))
	for _, h := range []transport.RemoteBuffer{small, big} {
		var reason string
		require.Eventually(t, func() bool {
			r, err := m.Route(h)
			reason = r.Reason
			return err == nil && strings.Contains(r.Reason, "its Close waits for these")
		}, 30*time.Second, time.Millisecond, "the route never said that the owner's Close waits for the ops: %s", reason)
	}
	src, srcMem := register(t, m, 4096, 0)
	testpeer.Fill(srcMem, 5)
	written := testpeer.Sum(testpeer.Pattern(4096, 5))
	dst, mem := register(t, m, size, 0)
	a := m.NewAction()
	if readFirst {
		a.ReadInto(dst, big).WriteFrom(small, src)
	} else {
		a.WriteFrom(small, src).ReadInto(dst, big)
	}
	done := make(chan error, 1)
	go func() { done <- a.Submit(context.Background()) }()
	require.Eventually(t, func() bool { return p.Sum(0, 0, 4096) == written },
		30*time.Second, 100*time.Microsecond, "the write did not land")
	require.Eventually(t, func() bool { return atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[0]))) != 0 },
		30*time.Second, 10*time.Microsecond, "the read did not begin")
	p.CloseBuf(0)
	require.Zero(t, atomic.LoadUint64((*uint64)(unsafe.Pointer(&mem[size-8]))),
		"the read had ended when the write's owner's Close returned: that Close waited for it")
	require.NoError(t, <-done)
	require.Equal(t, testpeer.Sum(testpeer.Pattern(size, 77)), testpeer.Sum(mem))
}

// TestCloseEndsShmOpsInFlight: a peer's long write over shm into a buffer
// this process closes while the write is under way. The peer's job
// watches the buffer's generation (its link to this process is up: the
// test waits for its Route to say so) and ends with a stale handle at its
// next check (before the check, on 2.x the write waited for its
// deadline, 30 s, and ended ErrTimeout). Its parts are marked, so no page
// lands after Close returned.
//
// libfabric 2.x without shm's CMA (fitransfer's default there) moves
// each chunk through its bounce buffers over several rounds of the
// owner's progress (SAR); the owner's provider resolved the key when the
// chunk began and copies its later segments after the registration is
// closed (smr_progress_sar_list). The peer's part is marked in its use
// page, so the owner's Close waits for it before it closes the
// registration: unmarked, 1,536 pages landed after Close.
func TestCloseEndsShmOpsInFlight(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	// On 1.x the default is with shm's CMA, and FI_SHM_DISABLE_CMA=1 in
	// the peer turns it off; on 2.x the default is without.
	variants := []bool{false, true}
	if fabric.RuntimeVersion().Major() >= 2 {
		variants = variants[:1]
	}
	for _, noCMA := range variants {
		t.Run(map[bool]string{false: "default", true: "without shm's CMA"}[noCMA], func(t *testing.T) {
			if noCMA {
				t.Setenv("FI_SHM_DISABLE_CMA", "1") // for the peer's process, which reads it at its start
			}
			const size = 256 << 20
			m := newManager(t, transport.WithProviders(testenv.RouteSHM))
			peer := testpeer.Start(t, testenv.RouteSHM)
			peer.Register(size, 0, 77) // the peer's source
			b, mem := register(t, m, size, mr.RemoteWrite)
			err := closeUnderPeerWrite(t, peer, b, mem, "its Close waits for these")
			assert.Contains(t, err.Error(), "stale or altered handle")
			assert.NotContains(t, err.Error(), "timed out")
		})
	}
}

// TestFirstOpIsMarked: the same with the peer's first op toward this
// process. The peer's first routing toward an owner it has just verified
// waits for its mem link's first dial, so that first op is marked (cma)
// or watched (shm) like later ones: no page lands after Close, and the
// write ends with a stale handle, not at its deadline. (Before, it ran
// before the use page was mapped: on cma the piece in flight landed
// after Close; on shm the write waited out its 30 s deadline.)
func TestFirstOpIsMarked(t *testing.T) {
	for _, rt := range []string{testenv.RouteCMA, testenv.RouteSHM} {
		t.Run(rt, func(t *testing.T) {
			testenv.RequireRoute(t, rt)
			const size = 256 << 20
			m := newManager(t, transport.WithProviders(rt))
			peer := testpeer.Start(t, rt)
			peer.Register(size, 0, 77) // the peer's source
			b, mem := register(t, m, size, mr.RemoteWrite)
			err := closeUnderPeerWrite(t, peer, b, mem, "")
			assert.Contains(t, err.Error(), "stale or altered handle")
			assert.NotContains(t, err.Error(), "timed out")
		})
	}
}
