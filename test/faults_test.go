package test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// The fault matrix: for read and write, over shm and tcp;ofi_rxm, with
// real processes. Every case must end in an error naming the peer and the
// cause, within the deadline, without goroutines left behind, and with a
// manager that still works for other peers.

// providers are the routes every matrix runs, each in turn: cma
// (fitransfer's own process_vm path, on every libfabric version), shm,
// tcp;ofi_rxm. A subtest of a route this machine lacks skips with the
// reason, or fails under CI=true (testenv.RequireRoute).
var providers = testenv.Routes()

const big = 64 << 20

func newManager(t *testing.T, opts ...transport.Option) *transport.Manager {
	m, err := transport.New(context.Background(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func register(t *testing.T, m *transport.Manager, n int, access mr.Access) (*transport.Buffer, []byte) {
	mem, err := mr.Alloc(n)
	require.NoError(t, err)
	b, err := m.Register(mem, access)
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close(); _ = mr.Free(mem) })
	return b, mem
}

func transfer(ctx context.Context, m *transport.Manager, op string, local *transport.Buffer, remote transport.RemoteBuffer) error {
	if op == "write" {
		return m.WriteFrom(ctx, remote, local)
	}
	return m.ReadInto(ctx, local, remote)
}

// goroutinesSettle waits until the process has no more goroutines than
// before.
func goroutinesSettle(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines left behind: %d, was %d:\n%s", runtime.NumGoroutine(), before, buf)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// peerOf is the address an error about h's owner must name.
func peerOf(t *testing.T, m *transport.Manager, h transport.RemoteBuffer) string {
	r, err := m.Route(h)
	require.NoError(t, err)
	require.NotEmpty(t, r.Peer)
	return r.Peer
}

// TestOwnerKilled: an owner killed with a transfer of 64 MiB in flight
// ends it within a few seconds (the context allows 20) with ErrPeerGone,
// naming the peer, without goroutines left behind. Then the manager works
// with another peer: over 2.x's shm, where ops to the dead owner block
// the endpoint they went out on (shm completes an endpoint's ops in
// order), the next transfer goes out on a new one.
func TestOwnerKilled(t *testing.T) {
	for _, prov := range providers {
		for _, op := range []string{"read", "write"} {
			t.Run(prov+"/"+op, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				want := expect(t, prov)
				m := newManager(t, transport.WithProviders(prov))
				victim, survivor := testpeer.Start(t, prov), testpeer.Start(t, prov)
				h := victim.Register(big, mr.ReadWrite, 1)
				other := survivor.Register(4096, mr.ReadWrite, 2)
				local, _ := register(t, m, big, mr.ReadWrite)
				peer := peerOf(t, m, h)
				before := runtime.NumGoroutine()

				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				var done atomic.Int64
				errc := make(chan error, 1)
				go func() {
					var err error
					for err == nil {
						if err = transfer(ctx, m, op, local, h); err == nil {
							done.Add(1)
						}
					}
					errc <- err
				}()
				// Kill the owner once a transfer completed: the loop has
				// posted the next one.
				require.Eventually(t, func() bool { return done.Load() > 0 }, 20*time.Second, time.Millisecond,
					"no transfer completed before the kill")
				start := time.Now()
				victim.Kill()
				var err error
				select {
				case err = <-errc:
				case <-time.After(30 * time.Second):
					t.Fatal("the transfer hangs after its owner was killed")
				}
				t.Logf("%v after the kill: %v", time.Since(start).Round(time.Millisecond), err)
				assert.Less(t, time.Since(start), 5*time.Second, "an error well within the deadline")
				// A *TransferError when the kill lands in an op, a bare
				// *PeerGoneError when it lands between two (the next one's
				// route finds the owner gone before anything moves): when
				// it lands is the fault's timing, so the test asserts what
				// both give.
				assert.Contains(t, err.Error(), peer, "the error names the peer")
				assert.ErrorIs(t, err, transport.ErrPeerGone, "the same class on every route")
				assert.False(t, transport.Retryable(err), "retrying cannot bring the peer back")
				var gone *progress.PeerGoneError
				require.ErrorAs(t, err, &gone)
				assert.NotEmpty(t, gone.Cause, "how it is known")
				goroutinesSettle(t, before)

				l4k, _ := local.Slice(0, 4096)
				start = time.Now()
				err = transfer(context.Background(), m, op, l4k, other)
				if want.ownerKilledBlocks {
					require.ErrorIs(t, err, transport.ErrEndpointBlocked, "ops to the dead owner block the endpoint for every peer")
					assert.Less(t, time.Since(start), 5*time.Second, "the blocked endpoint fails fast")
					assert.Contains(t, err.Error(), peer, "the error names the dead peer")
					assert.Contains(t, err.Error(), "open a new one")
					m = newManager(t, transport.WithProviders(prov))
					l4k, _ = register(t, m, 4096, mr.ReadWrite)
					require.NoError(t, transfer(context.Background(), m, op, l4k, other), "a new manager works with another peer")
				} else {
					require.NoError(t, err, "the manager still works with another peer")
				}
				if op == "read" {
					assert.Equal(t, testpeer.Pattern(4096, 2), l4k.Bytes(), "what the other peer holds")
				} else {
					assert.Equal(t, testpeer.Sum(l4k.Bytes()), survivor.Sum(0, 0, 4096), "what the other peer got")
				}
			})
		}
	}
}

// TestInitiatorKilled: an initiator killed in the middle of its transfers
// leaves the owner serving others. On libfabric 1.x's shm a dead initiator
// can leave the owner's shm endpoint spinning forever inside libfabric; the
// owner then retires that endpoint and opens another, so a new buffer and
// a new initiator work on every route.
func TestInitiatorKilled(t *testing.T) {
	for _, prov := range providers {
		for _, op := range []string{"read", "write"} {
			t.Run(prov+"/"+op, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				owner := testpeer.Start(t, prov)
				h := owner.Register(big, mr.ReadWrite, 5)

				victim := testpeer.Start(t, prov)
				victim.Register(big, mr.ReadWrite, 6)
				victim.Loop(op, 0, h)
				victim.WaitTransfers(3) // its transfers are under way
				victim.Kill()

				// The owner still registers (a stuck shm endpoint is
				// detected within progress.WedgeAfter and replaced)...
				fresh, err := owner.TryRegister(4096, mr.ReadWrite, 8)
				require.NoError(t, err, "the owner registers after its initiator died")
				// ...and serves another initiator.
				other := testpeer.Start(t, prov)
				other.Register(4096, mr.ReadWrite, 7)
				require.NoError(t, other.Transfer("write", 0, fresh), "the owner serves another initiator")
				assert.Equal(t, testpeer.Sum(testpeer.Pattern(4096, 7)), owner.Sum(1, 0, 4096))
				require.NoError(t, other.Transfer("read", 0, fresh))
			})
		}
	}
}

// TestInitiatorKilledMidCommand: on libfabric 2.x's shm an initiator
// claims a slot of the owner's command queue, fills it, then commits it
// (smr_generic_rma, prov/shm/src/smr_rma.c, v2.1.0); one killed in
// between stops the owner's reader at that slot for good, while the
// owner's progress calls go on returning. gdb kills the victim there, in
// the function that fills the command: smr_do_sar without CMA between the
// two (fitransfer's default on 2.x), smr_do_iov with it. The owner's
// check after the death finds its endpoint
// serving nothing and replaces it: a new buffer and a new initiator
// work. (1.x's shm holds a region lock there instead: TestInitiatorKilled.)
func TestInitiatorKilledMidCommand(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	if fabric.RuntimeVersion().Major() < 2 {
		t.Skip("libfabric 1.x's shm has no command queue to stall; its region lock is TestInitiatorKilled's")
	}
	gdbPath := testenv.RequireTool(t, "gdb")
	owner := testpeer.Start(t, testenv.RouteSHM)
	h := owner.Register(big, mr.ReadWrite, 5)
	victim := testpeer.Start(t, testenv.RouteSHM)
	victim.Register(big, mr.ReadWrite, 6)
	const fill = "smr_do_sar or smr_do_iov"
	killAtBreakpoint(t, gdbPath, victim, h, fill, "-ex", "break smr_do_sar", "-ex", "break smr_do_iov")
	requireOwnerServesAgain(t, owner, "after its initiator died mid-command")
}

// killAtBreakpoint has gdb attach to victim with the breakpoints that
// args set, lets victim write to h in a loop, and kills it at the first
// breakpoint it reaches (where names them, for the messages); then it
// reaps the victim, which removes its region.
func killAtBreakpoint(t *testing.T, gdbPath string, victim *testpeer.Peer, h transport.RemoteBuffer, where string, args ...string) {
	t.Helper()
	argv := append([]string{"-q", "-nx", "-batch", "-p", strconv.Itoa(victim.Pid),
		// Go's own signals (preemption, children) must not end the continue.
		"-ex", "handle SIGURG SIGCHLD SIGPIPE SIGPROF nostop noprint pass"}, args...)
	const set = "breakpoints set"
	gdb := exec.Command(gdbPath, append(argv, "-ex", "echo "+set+`\n`, "-ex", "continue", "-ex", "kill")...)
	out, err := gdb.StdoutPipe()
	require.NoError(t, err)
	gdb.Stderr = gdb.Stdout
	require.NoError(t, gdb.Start())
	t.Cleanup(func() { _ = gdb.Process.Kill(); _ = gdb.Wait() })
	// A victim that never reaches a breakpoint must not hang the test.
	defer time.AfterFunc(time.Minute, func() { _ = gdb.Process.Kill() }).Stop()
	lines := bufio.NewScanner(out)
	var said strings.Builder
	for !strings.Contains(said.String(), set) {
		require.True(t, lines.Scan(), "gdb did not get to %q:\n%s", set, said.String())
		said.WriteString(lines.Text() + "\n")
	}
	require.Contains(t, said.String(), "Breakpoint 1 at", "gdb set no breakpoint at %s in the victim's libfabric:\n%s", where, said.String())
	// gdb lets the victim go on now (continue): its writes come to a
	// breakpoint, where gdb kills it.
	victim.Loop("write", 0, h)
	for lines.Scan() {
		said.WriteString(lines.Text() + "\n")
	}
	require.NoError(t, gdb.Wait(), "%s", said.String())
	require.Regexp(t, `Breakpoint [0-9]+, `, said.String(), "the victim never reached %s:\n%s", where, said.String())
	require.Contains(t, said.String(), "killed", "%s", said.String())
	victim.Kill()
}

// requireOwnerServesAgain checks that owner registers a new buffer and
// that another initiator writes it and reads it over shm (after).
func requireOwnerServesAgain(t *testing.T, owner *testpeer.Peer, after string) {
	t.Helper()
	fresh, err := owner.TryRegister(4096, mr.ReadWrite, 8)
	require.NoError(t, err, "the owner registers %s", after)
	other := testpeer.Start(t, testenv.RouteSHM)
	other.Register(4096, mr.ReadWrite, 7)
	require.NoError(t, other.Transfer("write", 0, fresh), "the owner serves another initiator %s", after)
	assert.Equal(t, testpeer.Sum(testpeer.Pattern(4096, 7)), owner.Sum(1, 0, 4096))
	require.NoError(t, other.Transfer("read", 0, fresh))
}

// TestInitiatorKilledHoldingTheOwnersLock: on libfabric 2.x too an
// initiator takes the owner's shm region lock, for a moment, to take
// bounce buffers there (smr_format_sar, prov/shm/src/smr_ep.c, v2.1.0);
// killed inside (gdb stops it in the unlock that smr_format_sar calls,
// and kills it), it leaves the lock held for good, and every later op
// that takes it, the owner's own included, spins inside libfabric. The
// owner's check of its endpoint after the death must come back (it
// lets the loop's goroutine make the call, which wedges), the owner
// replaces the endpoint, registers, and serves another initiator. It
// hung in the check's own post before: no answer to the registration.
func TestInitiatorKilledHoldingTheOwnersLock(t *testing.T) {
	gdbPath := requireLockKill(t)
	owner := testpeer.Start(t, testenv.RouteSHM)
	h := owner.Register(big, mr.ReadWrite, 5)
	killHoldingTheOwnersLock(t, gdbPath, h)
	requireOwnerServesAgain(t, owner, "after its initiator died holding its region lock")
}

// TestInitiatorKeepsItsDeadlineBehindADeadPeersLock: a third process's
// write toward an owner whose region lock a killed initiator holds
// (TestInitiatorKilledHoldingTheOwnersLock) takes that lock in its post
// (smr_format_sar, v2.1.0), where it spins for good; the write still
// ends at its deadline, with the timeout that says a libfabric call had
// not returned, because on shm only the loop's goroutine calls
// libfabric (endpoint.CallsMayNeverReturn). On 2.x its waiter posted
// itself before, and spun past its deadline for good (found by hand: a
// serve's client hung, ignoring SIGTERM, after another client of that
// serve was killed).
func TestInitiatorKeepsItsDeadlineBehindADeadPeersLock(t *testing.T) {
	gdbPath := requireLockKill(t)
	owner := testpeer.Start(t, testenv.RouteSHM)
	h := owner.Register(big, mr.ReadWrite, 5)
	small := owner.Register(64, mr.ReadWrite, 6)
	third := testpeer.Start(t, testenv.RouteSHM)
	third.Register(64, mr.ReadWrite, 7)
	// Its handle check is kept from here on: the write below goes
	// straight to its post.
	require.NoError(t, third.Transfer("write", 0, small))
	killHoldingTheOwnersLock(t, gdbPath, h)

	const within = 2 * time.Second
	start := time.Now()
	err := third.TransferWithin("write", 0, small, within)
	took := time.Since(start)
	t.Logf("after %v: %v", took.Round(time.Millisecond), err)
	require.Error(t, err, "a write that takes the owner's region lock, which the dead initiator holds")
	assert.Contains(t, err.Error(), "timed out")
	// Left with the loop (progress.TimeoutError.Left), whose goroutine
	// spins in the post: not a wedge, which comes only after WedgeAfter.
	assert.Contains(t, err.Error(), "inside a libfabric call that had not returned, and the transfer's 1 chunks stay with it until it does")
	assert.Less(t, took, within+3*time.Second, "the error comes within the deadline + 3 s")
}

// requireLockKill skips on libfabric 1.x, whose shm holds the region
// lock for a whole copy (TestInitiatorKilled), and requires shm, shm's
// CMA off and gdb, for killHoldingTheOwnersLock; it returns gdb's path.
func requireLockKill(t *testing.T) string {
	t.Helper()
	testenv.RequireRoute(t, testenv.RouteSHM)
	if fabric.RuntimeVersion().Major() < 2 {
		t.Skip("libfabric 1.x's shm holds the region lock for a whole copy: TestInitiatorKilled")
	}
	if _, set := os.LookupEnv(fabric.ShmDisableCMA); set && !fabric.EnvTruthy(fabric.ShmDisableCMA) {
		// With shm's CMA on the victim's writes take no bounce buffers.
		testenv.Missing(t, fabric.ShmDisableCMA+" turns shm's CMA on: the victim never takes the owner's lock in smr_format_sar")
	}
	return testenv.RequireTool(t, "gdb")
}

// killHoldingTheOwnersLock starts a victim over shm writing to h in a
// loop and kills it inside smr_format_sar, holding the region lock of
// h's owner (libfabric 2.x; requireLockKill first).
func killHoldingTheOwnersLock(t *testing.T, gdbPath string, h transport.RemoteBuffer) {
	t.Helper()
	victim := testpeer.Start(t, testenv.RouteSHM)
	victim.Register(big, mr.ReadWrite, 6)

	// Breakpoints on the calls of pthread_spin_unlock in smr_format_sar
	// (inlined in smr_do_sar): the lock is held there. (A breakpoint in
	// the unlock itself, with a condition on its caller, stops the victim
	// at every spin lock of libfabric's, and gdb evaluates too slowly.)
	script := filepath.Join(t.TempDir(), "unlocks.py")
	require.NoError(t, os.WriteFile(script, []byte(`import gdb
for line in gdb.execute("disassemble smr_do_sar", to_string=True).splitlines():
    if "call" in line and "pthread_spin_unlock" in line:
        gdb.Breakpoint("*" + next(w for w in line.split() if w.startswith("0x")))
`), 0o644))
	killAtBreakpoint(t, gdbPath, victim, h, "smr_format_sar's unlock", "-x", script)
}

// TestOwnerStopped: a transfer to an owner stopped by SIGSTOP completes
// where the initiator copies alone (cma; shm on 1.x) — a write then has
// its bytes in the owner's memory when it returns — and elsewhere ends
// with a timeout at the manager's deadline, naming the peer (outcomes).
// Either way, after SIGCONT a new transfer works and no goroutine is left.
func TestOwnerStopped(t *testing.T) {
	for _, prov := range providers {
		for _, op := range []string{"read", "write"} {
			t.Run(prov+"/"+op, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				want := expect(t, prov).ownerStopped
				const deadline = 2 * time.Second
				const n = 1 << 20
				m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(deadline))
				owner := testpeer.Start(t, prov)
				h := owner.Register(n, mr.ReadWrite, 1)
				local, mem := register(t, m, n, mr.ReadWrite)
				require.NoError(t, transfer(context.Background(), m, op, local, h))
				peer := peerOf(t, m, h)
				before := runtime.NumGoroutine()

				testpeer.Fill(mem, 77)
				owner.Stop()
				start := time.Now()
				// No deadline in the context: the manager's applies.
				err := transfer(context.Background(), m, op, local, h)
				took := time.Since(start)
				t.Logf("after %v: %v", took.Round(time.Millisecond), err)
				switch want {
				case completes:
					require.NoError(t, err, "%s needs no owner progress", prov)
					if op == "write" {
						assert.True(t, bytes.Equal(mem, ownerBytes(t, owner, 0, n)),
							"WriteFrom returned while the stopped owner's memory lacks the bytes")
					} else {
						assert.Equal(t, testpeer.Pattern(n, 1), mem)
					}
				case checkTimesOut, opsTimeOut:
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorIs(t, err, transport.ErrTimeout)
					var to *progress.TimeoutError
					require.ErrorAs(t, err, &to)
					assert.Equal(t, 1, to.Total, "one chunk of 1 MiB")
					assert.Zero(t, to.Completed)
					var te *transport.TransferError
					require.ErrorAs(t, err, &te)
					if want == checkTimesOut {
						assert.Equal(t, "handle check", te.Op)
					} else {
						assert.Equal(t, op, te.Op)
					}
					assert.Contains(t, err.Error(), peer)
					assert.Contains(t, err.Error(), "timed out")
					assert.Less(t, took, deadline+time.Second, "the error comes within the deadline + 1 s")
					assert.GreaterOrEqual(t, took, deadline, "not before the deadline")
				}
				owner.Continue()
				goroutinesSettle(t, before)
				testpeer.Fill(mem, 78)
				require.Eventually(t, func() bool { return transfer(context.Background(), m, op, local, h) == nil },
					20*time.Second, 100*time.Millisecond, "a new transfer works after SIGCONT")
				if op == "write" {
					assert.Equal(t, testpeer.Sum(mem), owner.Sum(0, 0, n), "the write after SIGCONT arrived")
				} else {
					assert.Equal(t, testpeer.Pattern(n, 1), mem)
				}
			})
		}
	}
}

// TestOwnerStoppedFirst: a transfer that needs an answer of a stopped
// owner's manager before any op — a new manager's verification of the
// owner, or on the mem route the mapping of a buffer not mapped before —
// gets its error at its deadline: a timeout that says what it waited
// for, nothing moved, retryable. The verification's deadline is longer
// than the handshake's own bound (2 s), which the request outlives by
// verifying again; the mapping's is shorter. Where the route needs no
// such answer the transfer ends as TestOwnerStopped's do (outcomes).
// After SIGCONT the transfer works.
func TestOwnerStoppedFirst(t *testing.T) {
	for _, prov := range providers {
		for _, step := range []string{"verification", "new buffer"} {
			t.Run(prov+"/"+step, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				deadline := 300 * time.Millisecond
				if step == "verification" {
					deadline = 2500 * time.Millisecond
				}
				const n = 4096
				m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(deadline))
				owner := testpeer.Start(t, prov)
				first := owner.Register(n, mr.ReadWrite, 1)
				h := owner.Register(n, mr.ReadWrite, 2)
				local, mem := register(t, m, n, mr.ReadWrite)
				want := expect(t, prov).stoppedUnverified
				if step == "new buffer" {
					want = expect(t, prov).stoppedNewBuffer
					// The owner verified, the mem link up, and h not mapped.
					require.NoError(t, transfer(context.Background(), m, "read", local, first))
				}
				owner.Stop()
				start := time.Now()
				err := transfer(context.Background(), m, "read", local, h)
				took := time.Since(start)
				t.Logf("after %v: %v", took.Round(time.Millisecond), err)
				switch want {
				case completes:
					require.NoError(t, err, "%s needs no answer of the owner for a new buffer", prov)
					assert.Equal(t, testpeer.Pattern(n, 2), mem)
				case answerTimesOut, checkTimesOut, opsTimeOut:
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					assert.ErrorIs(t, err, transport.ErrTimeout)
					assert.True(t, transport.Retryable(err), "the owner may answer later")
					var to *progress.TimeoutError
					require.ErrorAs(t, err, &to)
					assert.Zero(t, to.Completed)
					var te *transport.TransferError
					require.ErrorAs(t, err, &te)
					if want == answerTimesOut {
						assert.Equal(t, "read", te.Op)
						assert.NotEmpty(t, to.Awaiting, "the error says what it waited for")
						assert.Contains(t, err.Error(), cma.Peer(owner.Pid), "the error names the owner's process")
						assert.Contains(t, err.Error(), "nothing moved")
					} else {
						assert.Empty(t, to.Awaiting)
					}
					assert.Less(t, took, deadline+time.Second, "the error comes within the deadline + 1 s")
					assert.GreaterOrEqual(t, took, deadline, "not before the deadline")
				}
				owner.Continue()
				testpeer.Fill(mem, 3)
				require.Eventually(t, func() bool { return transfer(context.Background(), m, "read", local, h) == nil },
					20*time.Second, 50*time.Millisecond, "a new transfer works after SIGCONT")
				assert.Equal(t, testpeer.Pattern(n, 2), mem)
			})
		}
	}
}

// ownerBytes reads bytes [off, off+n) of the owner's buffer buf from its
// memory with process_vm_readv: it works while the owner is stopped.
func ownerBytes(t *testing.T, owner *testpeer.Peer, buf int, n int) []byte {
	t.Helper()
	got := make([]byte, n)
	nr, err := unix.ProcessVMReadv(owner.Pid, []unix.Iovec{{Base: &got[0], Len: uint64(n)}},
		[]unix.RemoteIovec{{Base: uintptr(owner.Addr(buf)), Len: n}}, 0)
	require.NoError(t, err)
	require.Equal(t, n, nr)
	return got
}

func TestLinkCut(t *testing.T) {
	h := newHosts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := startServer(t, ctx, h.a, h.aIP, "--size", "64m")
	for _, op := range []string{"write", "read"} {
		t.Run(op, func(t *testing.T) {
			cmd := in(ctx, h.b, op, srv.addr, "-p", "tcp", "-s", h.bIP, "-S", "64m", "-I", "100000", "--timeout", "3s")
			errPipe, err := cmd.StderrPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			var mu sync.Mutex
			var stderr strings.Builder
			connected, eof := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(eof)
				sc := bufio.NewScanner(errPipe)
				once := sync.Once{}
				for sc.Scan() {
					mu.Lock()
					stderr.WriteString(sc.Text() + "\n")
					mu.Unlock()
					if strings.Contains(sc.Text(), " peer ") {
						once.Do(func() { close(connected) })
					}
				}
			}()
			select {
			case <-connected:
			case <-time.After(30 * time.Second):
				t.Fatal("the client did not connect")
			}
			// Cut the link once transfers are under way: 16 MiB more
			// crossed it than before the client connected.
			base := linkBytes(t, h.a, h.vethA)
			require.Eventually(t, func() bool { return linkBytes(t, h.a, h.vethA) > base+16<<20 }, 30*time.Second, 10*time.Millisecond,
				"no data crosses the link")
			require.NoError(t, runCmd("ip", "-n", h.a, "link", "set", h.vethA, "down"))
			start := time.Now()
			select {
			case <-eof:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatal("the client hangs after the link was cut")
			}
			took := time.Since(start)
			err = cmd.Wait()
			mu.Lock()
			msg := stderr.String()
			mu.Unlock()
			t.Logf("%v after the cut: %s", took.Round(time.Millisecond), strings.TrimSpace(msg))
			assert.Less(t, took, 3*time.Second+time.Second, "the error arrives within --timeout + 1 s")
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit)
			assert.Equal(t, 1, exit.ExitCode(), "the client exits with status 1, not on a signal: %v", err)
			// libinfinipath's handler (psm, loaded by Debian's libfabric)
			// turns a crash into "terminated with signal" and exit 1.
			assert.NotContains(t, msg, "terminated with signal", "the client does not crash")
			assert.NotContains(t, msg, "SIGSEGV", "the client does not crash")
			assert.Contains(t, msg, h.aIP, "the error names the peer")
			assert.Contains(t, msg, "timed out")
			require.NoError(t, runCmd("ip", "-n", h.a, "link", "set", h.vethA, "up"))
			// The server's manager still works, for a new client — once the
			// link is back: until neighbour discovery succeeds again the
			// kernel may still answer "no route to host", which is the
			// network's state, not the server's.
			var out []byte
			for back := time.Now().Add(15 * time.Second); ; time.Sleep(300 * time.Millisecond) {
				out, err = in(ctx, h.b, op, srv.addr, "-p", "tcp", "-s", h.bIP, "-S", "1m", "-I", "20", "-v").CombinedOutput()
				if err == nil || !strings.Contains(string(out), "no route to host") || time.Now().After(back) {
					break
				}
			}
			require.NoError(t, err, string(out))
		})
	}
}
