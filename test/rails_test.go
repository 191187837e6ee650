package test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/netlab"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// envRailLab tells a copy of this test binary that it runs inside the lab
// (in namespace A): "A B rails".
const envRailLab = "FITRANSFER_TEST_RAIL_LAB"

const (
	labRails = 4
	// labRate keeps each link, not this 2-core machine, the limit, and a
	// transfer long enough to be cut in the middle.
	labRate     = "200mbit"
	railTimeout = 15 * time.Second
)

// TestRails runs transfers between two hosts joined by 4 links, over
// tcp;ofi_rxm with one rail per link: striped transfers with every byte
// checked, one link cut in the middle of transfers, all links cut. The
// test's manager must run in the lab's namespace A, so each case runs in
// a copy of this test binary started there; its owner runs in B.
func TestRails(t *testing.T) {
	if v := os.Getenv(envRailLab); v != "" {
		runInLab(t, v)
		return
	}
	testenv.RequireRoot(t) // ip netns
	lab, err := netlab.New(labRails, labRate)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lab.Close() })
	exe, err := os.Executable()
	require.NoError(t, err)
	for _, name := range []string{"stripe", "stale", "stopped", "allocs", "cut-one", "late-write", "cut-all"} {
		t.Run(name, func(t *testing.T) {
			if name == "allocs" && raceEnabled {
				t.Skip("the race detector allocates for its own bookkeeping; make test runs this case without it")
			}
			cmd := exec.Command("ip", "netns", "exec", lab.A, exe, "-test.run=^TestRails$/^"+name+"$", "-test.v", "-test.count=1")
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, testenv.TCPIfaceEnv+"=") { // the lab's hosts talk over their rails
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, envRailLab+"="+lab.A+" "+lab.B+" "+strconv.Itoa(labRails),
				transport.RailsEnv+"="+lab.RailList(labRails))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Contains(t, string(out), "--- PASS: TestRails/"+name, "%s", out)
			t.Logf("%s", out)
		})
	}
}

// railCase is a case of TestRails as it runs in the lab.
type railCase struct {
	lab  *netlab.Lab
	m    *transport.Manager
	peer *testpeer.Peer
	bufs int    // buffers the owner registered
	seed uint64 // TEST_SEED replays a run
	// peerMu: the owner answers one request at a time.
	peerMu sync.Mutex
}

func runInLab(t *testing.T, spec string) {
	f := strings.Fields(spec)
	require.Len(t, f, 3)
	n, err := strconv.Atoi(f[2])
	require.NoError(t, err)
	lab := &netlab.Lab{A: f[0], B: f[1], Rails: n}
	// TestMain kept tcp to loopback; the lab's hosts talk over their
	// rails (peers started from here inherit this).
	require.NoError(t, os.Unsetenv(testenv.TCPIfaceEnv))
	newCase := func(t *testing.T, timeout time.Duration, providers ...string) *railCase {
		if providers == nil {
			providers = []string{"tcp"}
		}
		m, err := transport.New(context.Background(), transport.WithProviders(providers...), transport.WithTimeout(timeout))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		require.Len(t, m.Rails(), n, "%s names %d rails", transport.RailsEnv, n)
		seed := integritySeed(t)
		t.Logf("seed %d (TEST_SEED=%d replays it)", seed, seed)
		return &railCase{lab: lab, m: m, peer: testpeer.StartIn(t, lab.B, "tcp"), seed: seed}
	}
	t.Run("stripe", func(t *testing.T) {
		c := newCase(t, railTimeout)
		w := c.newWorker(t, 1, 64<<20)
		for i := 0; i < 40; i++ {
			require.NoError(t, w.op())
		}
		for _, r := range c.m.Rails() {
			assert.True(t, r.Up, "rail %d", r.Rail)
			assert.Positive(t, r.Bytes, "rail %d carried nothing", r.Rail)
		}
	})
	t.Run("stale", func(t *testing.T) {
		// A striped read of a buffer its owner closed fails as a stale
		// handle — the owner's refusal, not the rails' — and takes no
		// rail out of use.
		c := newCase(t, railTimeout)
		w := c.newWorker(t, 1, 16<<20)
		require.NoError(t, w.op())
		c.peerMu.Lock()
		c.peer.CloseBuf(w.buf)
		c.peerMu.Unlock()
		err := c.m.ReadInto(context.Background(), w.reg, w.remote)
		require.Error(t, err)
		assert.ErrorIs(t, err, transport.ErrStaleHandle)
		assert.NotErrorIs(t, err, transport.ErrNoRail)
		for _, r := range c.m.Rails() {
			assert.True(t, r.Up, "rail %d", r.Rail)
			assert.Zero(t, r.Failures, "rail %d", r.Rail)
		}
	})
	t.Run("stopped", func(t *testing.T) {
		// A read below the striping size (one rail) of an owner that
		// stopped ends at the request's deadline, the manager's timeout
		// as the context has none, and takes no rail out of use: a
		// stopped owner is no rail's fault, and the request is not tried
		// again over the other rails with a deadline of its own.
		const timeout = 2 * time.Second
		c := newCase(t, timeout)
		w := c.newWorker(t, 1, 64<<10)
		local, err := w.reg.Slice(0, 4096)
		require.NoError(t, err)
		remote, err := w.remote.Slice(0, 4096)
		require.NoError(t, err)
		require.NoError(t, c.m.ReadInto(context.Background(), local, remote))
		c.peer.Stop()
		defer c.peer.Continue()
		start := time.Now()
		err = c.m.ReadInto(context.Background(), local, remote)
		took := time.Since(start)
		t.Logf("after %v: %v", took.Round(time.Millisecond), err)
		assert.ErrorIs(t, err, transport.ErrTimeout)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Less(t, took, timeout+time.Second, "the error comes within the deadline + 1 s")
		assert.GreaterOrEqual(t, took, timeout, "not before the deadline")
		for _, r := range c.m.Rails() {
			assert.True(t, r.Up, "rail %d", r.Rail)
			assert.Zero(t, r.Failures, "rail %d", r.Rail)
		}
	})
	t.Run("allocs", func(t *testing.T) {
		// A ReadInto or WriteFrom below the striping size goes to one
		// rail as it is: nothing allocated per op, as with one rail
		// (transport's TestNoAllocsPerOp). Make test runs it without the
		// race detector, whose bookkeeping allocates.
		if raceEnabled {
			t.Skip("the race detector allocates for its own bookkeeping; make test runs this case without it")
		}
		c := newCase(t, railTimeout)
		w := c.newWorker(t, 1, 64<<10)
		ctx := context.Background()
		for _, n := range []uint64{8, 4096, 64 << 10} {
			remote, err := w.remote.Slice(0, n)
			require.NoError(t, err)
			local, err := w.reg.Slice(0, n)
			require.NoError(t, err)
			for name, op := range map[string]func() error{
				"ReadInto":  func() error { return c.m.ReadInto(ctx, local, remote) },
				"WriteFrom": func() error { return c.m.WriteFrom(ctx, remote, local) },
			} {
				for i := 0; i < 10; i++ { // connect every rail, fill the pools
					require.NoError(t, op())
				}
				var failed error
				allocs := testing.AllocsPerRun(200, func() {
					if err := op(); err != nil && failed == nil {
						failed = err
					}
				})
				require.NoError(t, failed)
				assert.Zero(t, allocs, "%s of %d bytes over 4 rails: allocations per op", name, n)
			}
		}
	})
	t.Run("cut-one", func(t *testing.T) {
		c := newCase(t, railTimeout)
		const cut = 2
		var (
			wg    sync.WaitGroup
			done  = make(chan struct{})
			errMu sync.Mutex
			errs  []error
		)
		for g := 0; g < 2; g++ {
			w := c.newWorker(t, uint64(g+1), 32<<20)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-done:
						return
					default:
					}
					if err := w.op(); err != nil {
						errMu.Lock()
						errs = append(errs, err)
						errMu.Unlock()
						return
					}
				}
			}()
		}
		// ok fails the test as soon as a worker stopped on an error.
		ok := func() {
			errMu.Lock()
			defer errMu.Unlock()
			if len(errs) > 0 {
				t.Fatalf("an op over the rails left failed: %v", errs)
			}
		}
		c.waitTraffic(t, cut)
		require.NoError(t, c.lab.Cut(cut))
		t.Cleanup(func() { _ = c.lab.Restore(cut) })
		waitFor(t, "the cut rail taken out of use", func() bool { ok(); return c.m.Rails()[cut].Failures > 0 })
		before := c.m.Rails()
		waitFor(t, "the other rails carrying on", func() bool {
			ok()
			now := c.m.Rails()
			for i := range now {
				if i != cut && now[i].Bytes < before[i].Bytes+32<<20 {
					return false
				}
			}
			return true
		})
		require.NoError(t, c.lab.Restore(cut))
		back := c.m.Rails()[cut].Bytes
		waitFor(t, "a probe bringing the rail back", func() bool {
			ok()
			r := c.m.Rails()[cut]
			return r.Up && r.Bytes > back+4<<20
		})
		close(done)
		wg.Wait()
		ok()
	})
	t.Run("late-write", func(t *testing.T) {
		// A write whose rail is cut under it is redone over the others
		// and returns nil; what the cut rail's sockets still queued must
		// never reach the owner — not even when the link comes back,
		// after a newer write to the same bytes returned.
		c := newCase(t, railTimeout)
		const cut = 1
		w := c.newWorker(t, 1, 64<<20)
		writeAll := func() {
			t.Helper()
			fillRandom(w.rng, w.local)
			require.NoError(t, c.m.WriteFrom(context.Background(), w.remote, w.reg))
			copy(w.shadow, w.local)
			require.Equal(t, testpeer.Sum(w.shadow), c.sum(w.buf, w.shadow), "the owner's bytes after a nil write")
		}
		got := make(chan error, 1)
		fillRandom(w.rng, w.local)
		go func() { got <- c.m.WriteFrom(context.Background(), w.remote, w.reg) }()
		c.waitTraffic(t, cut)
		require.NoError(t, c.lab.Cut(cut))
		t.Cleanup(func() { _ = c.lab.Restore(cut) })
		require.NoError(t, <-got, "the write goes on over the rails left")
		copy(w.shadow, w.local)
		require.Equal(t, testpeer.Sum(w.shadow), c.sum(w.buf, w.shadow))
		require.Positive(t, c.m.Rails()[cut].Failures)
		writeAll() // newer bytes, over the three rails left
		require.NoError(t, c.lab.Restore(cut))
		// Readiness: every socket of this process on the restored link
		// has nothing left to send (sent and acknowledged, or aborted).
		waitFor(t, "the restored link's sockets to drain", func() bool { return queuedOn(t, c.lab.AddrA(cut)) == 0 })
		assert.Equal(t, testpeer.Sum(w.shadow), c.sum(w.buf, w.shadow),
			"VIOLATION: the owner's bytes changed after the newer write returned nil (the cut rail's queued data arrived late)")
	})
	t.Run("cut-all", func(t *testing.T) {
		c := newCase(t, railTimeout, "tcp", testenv.RouteCMA) // cma for the same-node read at the end
		w := c.newWorker(t, 1, 256<<20)
		local, err := c.m.Register(w.local, 0)
		require.NoError(t, err)
		defer local.Close()
		got := make(chan error, 1)
		start := time.Now()
		go func() { got <- c.m.ReadInto(context.Background(), local, w.remote) }()
		for i := 0; i < labRails; i++ {
			c.waitTraffic(t, i)
		}
		for i := 0; i < labRails; i++ {
			require.NoError(t, c.lab.Cut(i))
		}
		t.Cleanup(func() {
			for i := 0; i < labRails; i++ {
				_ = c.lab.Restore(i)
			}
		})
		select {
		case err := <-got:
			require.Error(t, err)
			assert.ErrorIs(t, err, transport.ErrNoRail)
			assert.ErrorContains(t, err, "every one of the 4 tcp;ofi_rxm rails failed")
			t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
		case <-time.After(railTimeout + 5*time.Second):
			t.Fatalf("no error %v after every rail was cut (timeout %v)", time.Since(start), railTimeout)
		}
		// With every rail down, a long op toward a process of this
		// node takes its same-node route as before.
		near := testpeer.Start(t, testenv.RouteCMA)
		const n = 4 << 20
		h := near.Register(n, mr.ReadWrite, 5)
		mem, err := mr.Alloc(n)
		require.NoError(t, err)
		defer func() { _ = mr.Free(mem) }()
		nearLocal, err := c.m.Register(mem, 0)
		require.NoError(t, err)
		defer nearLocal.Close()
		require.NoError(t, c.m.ReadInto(context.Background(), nearLocal, h), "a same-node read with every rail down")
		require.Equal(t, testpeer.Pattern(n, 5), mem)
	})
}

// railWorker runs random ops against one buffer of the owner, and keeps
// what that buffer holds (shadow) to check every op against.
type railWorker struct {
	c      *railCase
	rng    *rand.Rand
	buf    int
	remote transport.RemoteBuffer
	shadow []byte
	local  []byte
	reg    *transport.Buffer
}

func (c *railCase) newWorker(t *testing.T, seed uint64, size int) *railWorker {
	s := c.seed + seed
	c.peerMu.Lock()
	h := c.peer.Register(size, mr.ReadWrite, s)
	c.bufs++
	buf := c.bufs - 1
	c.peerMu.Unlock()
	local, err := mr.Alloc(size)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(local) })
	reg, err := c.m.Register(local, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Close() })
	rails := 0
	for _, p := range h.Providers() {
		if p == "tcp;ofi_rxm" {
			rails++
		}
	}
	require.Equal(t, labRails, rails, "the owner's handle names each of its rails: %v", h.Providers())
	return &railWorker{c: c, rng: rand.New(rand.NewPCG(s, seed)), buf: buf, remote: h,
		shadow: testpeer.Pattern(size, s), local: local, reg: reg}
}

// op runs one random read or write, of 1 B to 3/4 of the buffer, and
// checks it: nil means the bytes are where they belong. It returns the
// op's error, or a violation: nil with the wrong bytes.
func (w *railWorker) op() error {
	size := uint64(len(w.shadow))
	var n uint64
	switch w.rng.IntN(4) {
	case 0:
		n = 1 + w.rng.Uint64N(64<<10)
	case 1:
		n = 1 + w.rng.Uint64N(1<<20)
	default:
		n = 1 + w.rng.Uint64N(size*3/4)
	}
	off := w.rng.Uint64N(size - n + 1)
	loff := w.rng.Uint64N(size - n + 1)
	remote, err := w.remote.Slice(off, n)
	if err != nil {
		return err
	}
	local, err := w.reg.Slice(loff, n)
	if err != nil {
		return err
	}
	if w.rng.IntN(2) == 0 {
		if err := w.c.m.ReadInto(context.Background(), local, remote); err != nil {
			return err
		}
		if !bytes.Equal(w.local[loff:loff+n], w.shadow[off:off+n]) {
			return fmt.Errorf("VIOLATION: read of %d bytes at %d returned nil, but the bytes differ", n, off)
		}
		return nil
	}
	fillRandom(w.rng, w.local[loff:loff+n])
	if err := w.c.m.WriteFrom(context.Background(), remote, local); err != nil {
		return err
	}
	copy(w.shadow[off:off+n], w.local[loff:loff+n])
	w.c.peerMu.Lock()
	got := w.c.peer.Sum(w.buf, off, n)
	w.c.peerMu.Unlock()
	if got != testpeer.Sum(w.shadow[off:off+n]) {
		return fmt.Errorf("VIOLATION: write of %d bytes at %d returned nil, but the owner's bytes differ", n, off)
	}
	return nil
}

// sum is the owner's checksum of its whole buffer buf.
func (c *railCase) sum(buf int, shadow []byte) string {
	c.peerMu.Lock()
	defer c.peerMu.Unlock()
	return c.peer.Sum(buf, 0, uint64(len(shadow)))
}

// tcpClose is TCP_CLOSE, the state of an aborted connection.
const tcpClose = 7

// queuedOn is how many bytes this process's open TCP connections bound
// to ip still hold to send (SIOCOUTQ: unsent and unacknowledged).
func queuedOn(t *testing.T, ip string) int {
	entries, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	total := 0
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			continue
		}
		if a, ok := sa.(*unix.SockaddrInet4); !ok || net.IP(a.Addr[:]).String() != ip {
			continue
		}
		if info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO); err != nil || info.State == tcpClose {
			continue // not TCP, or aborted: its queue is gone (SIOCOUTQ still counts it)
		}
		if n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ); err == nil {
			total += n
		}
	}
	return total
}

// waitTraffic waits until rail i's link carried 1 MiB more than when
// called: a transfer is under way on it.
func (c *railCase) waitTraffic(t *testing.T, i int) {
	t.Helper()
	start, err := c.lab.Bytes(i)
	require.NoError(t, err)
	waitFor(t, "traffic on rail "+strconv.Itoa(i), func() bool {
		n, err := c.lab.Bytes(i)
		return err == nil && n > start+1<<20
	})
}

// waitFor polls cond until it holds, failing t after railTimeout.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * railTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s", 2*railTimeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
