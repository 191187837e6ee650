package progress

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
)

// fakePort is a queue without libfabric: posted ops wait in pending until
// the test (or auto) completes them; post can take fewer ops than offered
// (FI_EAGAIN), fail one for good, or block (a call that never returns).
type fakePort struct {
	mu       sync.Mutex
	pending  []uint32 // slots posted and not completed, in post order
	ops      map[uint32]fabric.Op
	batch    []fabric.Op // set by the loop, posted by post
	offered  []int       // n of every post call
	done     []uint32    // completions to hand out at the next reap
	errs     []fabric.CQError
	accept   int // ops one post takes at most; 0: all
	failNext fabric.Errno
	auto     bool          // every pending op completes at the next reap
	autoIf   func() bool   // as auto, at a reap where it returns true (called under the loop's drive lock)
	slow     time.Duration // each reap takes this long (tcp moving megabytes inside fi_cq_read)
	slowPost time.Duration // each op a post takes costs this long (2.x's tcp sending inline as the reader drains)
	rng      *rand.Rand
	gate     chan struct{} // when set, the next post blocks until it is closed
	blocked  chan struct{} // closed when post blocks on gate
	mayHang  bool          // callsMayNeverReturn
	// unsafeClose: unsafeToCloseInFlight (1.x's tcp;ofi_rxm): shutdown
	// drains completions first.
	unsafeClose bool
	posted      atomic.Int64
	closed      bool
	// canWait makes the port waitable: wait blocks until signal, traffic
	// or its timeout, as a CQ's wait fd that nothing completes to.
	canWait bool
	sig     chan struct{}
	traffic chan struct{} // a peer's op on this target: wakes a wait, completes nothing
	remote  atomic.Uint64 // peers' RMA ops on this target (remoteOps)
	counted bool          // hasRemoteOps
	// peerStream: peers' ops reach the target between any two looks at
	// its remote counter.
	peerStream bool
	waits      atomic.Int64 // wait calls
	inWait     atomic.Bool  // a wait call is under way
	reaps      atomic.Int64 // CQ reads, by reap or wait: rounds of progress
}

func newFakePort() *fakePort {
	return &fakePort{ops: map[uint32]fabric.Op{}, batch: make([]fabric.Op, postBatch), sig: make(chan struct{}, 1), traffic: make(chan struct{}, 1)}
}

func (f *fakePort) provider() string { return "fake" }

func (f *fakePort) set(i int, op fabric.Op) {
	f.mu.Lock()
	f.batch[i] = op
	f.mu.Unlock()
}

func (f *fakePort) post(n int) (int, error) {
	f.mu.Lock()
	gate := f.gate
	f.gate = nil // one post blocks
	f.mu.Unlock()
	if gate != nil {
		close(f.blocked)
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.offered = append(f.offered, n)
	k := n
	if f.accept > 0 && k > f.accept {
		k = f.accept
	}
	if f.failNext != 0 && k > 0 {
		k--
	}
	if f.slowPost > 0 {
		time.Sleep(time.Duration(k) * f.slowPost)
	}
	for _, op := range f.batch[:k] {
		if _, dup := f.ops[op.Slot]; dup {
			panic("slot " + strconv.Itoa(int(op.Slot)) + " posted twice")
		}
		f.ops[op.Slot] = op
		f.pending = append(f.pending, op.Slot)
	}
	f.posted.Add(int64(k))
	switch {
	case f.failNext != 0:
		err := &fabric.CallError{Call: "fi_readmsg/fi_writemsg", Errno: f.failNext}
		f.failNext = 0
		return k, err
	case k < n:
		return k, &fabric.CallError{Call: "fi_readmsg/fi_writemsg", Errno: fabric.ErrAgain}
	}
	return k, nil
}

func (f *fakePort) reap() ([]uint32, error) {
	f.reaps.Add(1)
	if f.slow > 0 {
		time.Sleep(f.slow)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if (f.auto || f.autoIf != nil && f.autoIf()) && len(f.pending) > 0 {
		n := len(f.pending)
		if f.rng != nil {
			n = 1 + f.rng.IntN(n)
		}
		f.done = append(f.done, f.pending[:n]...)
		f.pending = append(f.pending[:0], f.pending[n:]...)
	}
	out := f.done
	f.done = nil
	for _, s := range out {
		delete(f.ops, s)
	}
	if len(f.errs) > 0 {
		return out, &fabric.CallError{Call: "fi_cq_read", Errno: fabric.ErrAvail}
	}
	return out, nil
}

func (f *fakePort) readErr() (fabric.CQError, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.errs) == 0 {
		return fabric.CQError{}, false, nil
	}
	e := f.errs[0]
	f.errs = f.errs[1:]
	delete(f.ops, e.Slot)
	return e, true, nil
}

func (f *fakePort) waitable() bool { return f.canWait }

func (f *fakePort) remoteOps() uint64 {
	if f.peerStream {
		return f.remote.Add(1) // a peer's op came since every look
	}
	return f.remote.Load()
}

func (f *fakePort) hasRemoteOps() bool { return f.counted }

func (f *fakePort) tryWait() (bool, error) { return true, nil }

func (f *fakePort) block(ms int) (bool, error) {
	f.waits.Add(1)
	f.inWait.Store(true)
	defer f.inWait.Store(false)
	t := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-f.sig:
		return false, nil
	case <-f.traffic:
		return true, nil
	case <-t.C:
		return false, nil
	}
}

// signal is kept until a wait takes it, as libfabric's CQ keeps one.
func (f *fakePort) signal() {
	select {
	case f.sig <- struct{}{}:
	default:
	}
}

func (f *fakePort) pollEQ() *fabric.EQError       { return nil }
func (f *fakePort) unsafeToCloseInFlight() bool   { return f.unsafeClose }
func (f *fakePort) abandon()                      {}
func (f *fakePort) callsMayNeverReturn() bool     { return f.mayHang }
func (f *fakePort) close()                        { f.mu.Lock(); f.closed = true; f.mu.Unlock() }
func (f *fakePort) setAuto(on bool, r *rand.Rand) { f.mu.Lock(); f.auto, f.rng = on, r; f.mu.Unlock() }

// complete completes the first n pending ops (all when n < 0).
func (f *fakePort) complete(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n < 0 || n > len(f.pending) {
		n = len(f.pending)
	}
	f.done = append(f.done, f.pending[:n]...)
	f.pending = append(f.pending[:0], f.pending[n:]...)
}

// fail turns the first pending op into an error completion.
func (f *fakePort) fail(errno fabric.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.pending[0]
	f.pending = f.pending[1:]
	f.errs = append(f.errs, fabric.CQError{Err: errno, Slot: s, ProvMessage: "injected"})
}

func (f *fakePort) inFlight() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// testLoop is a loop over a fake port with depth op contexts. It does not
// run its background goroutine unless background is set: tests step it.
func testLoop(t *testing.T, depth int, background bool) (*Loop, *fakePort) {
	t.Helper()
	f := newFakePort()
	l := newLoop(f, depth, BusyPollPolicy, zerolog.Nop())
	if background {
		go l.run()
		t.Cleanup(func() { l.Close(nil) })
	}
	return l, f
}

// requireRunsUnwaited submits j with nobody waiting for it and fails the
// test with why unless the loop finishes it within 10 s.
func requireRunsUnwaited(t *testing.T, l *Loop, j *Job, why string) {
	t.Helper()
	require.NoError(t, l.Submit(j))
	select {
	case <-j.done:
	case <-time.After(10 * time.Second):
		t.Fatal(why)
	}
}

// step is one round of progress, as a driver does it.
func step(l *Loop) bool {
	l.drive.Lock()
	defer l.drive.Unlock()
	return l.iterate(monoNow())
}

// job is a job of n chunks of 8 bytes; idle counts its OnIdle calls.
func job(n int, idle *atomic.Int32) *Job {
	j := NewJob()
	fillJob(j, n, 0)
	j.OnIdle = func(*Job) {
		if idle != nil {
			idle.Add(1)
		}
	}
	return j
}

func fillJob(j *Job, n int, base uintptr) {
	for i := 0; i < n; i++ {
		j.Chunks = append(j.Chunks, Chunk{Local: base + uintptr(8*i+8), Len: 8, Remote: uint64(8 * i), Offset: uint64(8 * i)})
	}
}

// checkFinished asserts the loop's contract for a finished job: no error
// means every chunk completed.
func checkFinished(t *testing.T, j *Job) {
	t.Helper()
	if len(j.Errs) == 0 {
		assert.Equal(t, len(j.Chunks), j.Completed, "a job without errors must have completed every chunk")
	}
}

func isDone(j *Job) bool {
	select {
	case <-j.done:
		return true
	default:
		return false
	}
}

func TestLoopPostsAgainAfterEAGAIN(t *testing.T) {
	l, f := testLoop(t, 256, false)
	f.accept = 1 // the provider takes one op per call, answering FI_EAGAIN to the rest
	f.setAuto(true, nil)
	var idle atomic.Int32
	j := job(100, &idle)
	require.NoError(t, l.Submit(j))
	for i := 0; i < 1000 && !j.finished; i++ {
		step(l)
	}
	require.True(t, isDone(j))
	assert.Empty(t, j.Errs)
	assert.Equal(t, 100, j.Completed)
	assert.Equal(t, 100, j.Attempted)
	assert.Equal(t, int64(100), f.posted.Load(), "every chunk posted once")
	assert.Equal(t, int32(1), idle.Load())
	// After the first FI_EAGAIN the loop offers one op more than went
	// through, instead of the whole batch again.
	require.Greater(t, len(f.offered), 2)
	assert.Equal(t, 64, f.offered[0])
	for _, n := range f.offered[1:] {
		assert.LessOrEqual(t, n, 2)
	}
	assert.Equal(t, 0, l.inflight)
	assert.Len(t, l.free, 256)
}

func TestLoopPostFailureFailsTheChunk(t *testing.T) {
	l, f := testLoop(t, 16, false)
	f.failNext = fabric.ErrInval
	f.setAuto(true, nil)
	j := job(4, nil)
	require.NoError(t, l.Submit(j))
	for i := 0; i < 100 && !j.finished; i++ {
		step(l)
	}
	require.True(t, isDone(j))
	require.Len(t, j.Errs, 1)
	var ce *Error
	require.ErrorAs(t, j.Errs[0], &ce)
	assert.True(t, ce.Posting)
	assert.ErrorIs(t, j.Errs[0], fabric.ErrInval)
	checkFinished(t, j)
}

// The interleaving behind "ReadInto returned nil and the bytes were not
// there": a job whose context ends while it is still in the inbox is
// finished by its waiter, settles, and is reused by its submitter. Had it
// stayed in the inbox, the next round would take the reused job in and
// finish it at once — a stale token in done, which ends the next Wait of
// the new transfer with no chunk completed.
func TestLoopJobExpiredInInboxLeavesEveryQueue(t *testing.T) {
	l, f := testLoop(t, 16, false)
	var idle atomic.Int32
	j := job(8, &idle)
	require.NoError(t, l.Submit(j)) // in the inbox: no round has run

	l.drive.Lock()
	l.abort(j, j.gen.Load(), context.DeadlineExceeded)
	l.drive.Unlock()
	require.True(t, isDone(j), "the waiter is woken")
	var te *TimeoutError
	require.ErrorAs(t, j.Errs[0], &te)
	assert.Equal(t, 0, j.Attempted)
	assert.Equal(t, int32(1), idle.Load(), "nothing in flight: settled at once")
	assert.Empty(t, l.inbox)
	assert.Empty(t, l.running)
	assert.Empty(t, l.active)

	// The submitter reuses it for a transfer whose ops do not complete.
	j.Reset()
	fillJob(j, 2, 0x1000)
	step(l)
	require.False(t, isDone(j), "nothing may finish the reused job before it is submitted")
	require.NoError(t, l.Submit(j))
	step(l)
	assert.Equal(t, 2, f.inFlight())
	assert.False(t, isDone(j), "its chunks are still in flight")
	f.complete(-1)
	step(l)
	require.True(t, isDone(j))
	assert.Empty(t, j.Errs)
	checkFinished(t, j)
	assert.Equal(t, int32(2), idle.Load())
}

func TestLoopDeadlineOfQueuedAndPostedJobs(t *testing.T) {
	l, f := testLoop(t, 2, false) // two op contexts: b waits for a's
	var idleA, idleB, strandA, strandB atomic.Int32
	a, b := job(4, &idleA), job(4, &idleB)
	a.OnStrand = func(j *Job) {
		assert.Equal(t, 2, j.InFlight(), "on the loop, with its ops in flight")
		strandA.Add(1)
	}
	b.OnStrand = func(*Job) { strandB.Add(1) }
	past := time.Now().Add(-time.Second)
	a.Deadline, b.Deadline = time.Now().Add(time.Hour), past
	require.NoError(t, l.Submit(a))
	require.NoError(t, l.Submit(b))
	step(l)
	assert.Equal(t, 2, f.inFlight(), "a holds both contexts")
	l.drive.Lock()
	l.checkDeadlines(time.Now(), monoNow())
	l.drive.Unlock()
	require.True(t, isDone(b), "b expired while queued behind a")
	var te *TimeoutError
	require.ErrorAs(t, b.Errs[0], &te)
	assert.ErrorIs(t, b.Errs[0], context.DeadlineExceeded)
	assert.Equal(t, 0, b.Attempted)
	assert.Equal(t, int32(1), idleB.Load())
	assert.Zero(t, strandB.Load(), "nothing of b was in flight")
	assert.False(t, isDone(a))

	// a expires with two chunks in flight: it finishes now, and settles
	// (OnIdle: its memory may go) only when they complete.
	a.Deadline = past
	l.drive.Lock()
	l.checkDeadlines(time.Now(), monoNow())
	l.drive.Unlock()
	require.True(t, isDone(a))
	require.ErrorAs(t, a.Errs[0], &te)
	assert.Equal(t, int32(0), idleA.Load(), "chunks in flight: not idle")
	assert.Equal(t, 2, a.InFlight())
	assert.Equal(t, int32(1), strandA.Load(), "finished with ops in flight: stranded, once")
	f.complete(1)
	step(l)
	assert.Equal(t, int32(0), idleA.Load())
	f.complete(-1)
	step(l)
	assert.Equal(t, int32(1), idleA.Load())
	assert.Equal(t, int32(1), strandA.Load())
	assert.Equal(t, 0, l.inflight)
	assert.Len(t, l.free, 2)
	assert.Equal(t, 0, a.Completed, "completions after the job finished are not counted")
	assert.False(t, isDone(a), "one wake-up per job")

	// Reuse after expiry: the new generation completes in full.
	b.Reset()
	fillJob(b, 3, 0x100)
	require.NoError(t, l.Submit(b))
	f.setAuto(true, nil)
	for i := 0; i < 10 && !b.finished; i++ {
		step(l)
	}
	require.True(t, isDone(b))
	assert.Empty(t, b.Errs)
	assert.Equal(t, 3, b.Completed)
}

func TestLoopSubmitTwiceIsRefused(t *testing.T) {
	l, _ := testLoop(t, 4, false)
	j := job(1, nil)
	require.NoError(t, l.Submit(j))
	assert.ErrorIs(t, l.Submit(j), ErrJobBusy)
}

func TestLoopErrorCompletion(t *testing.T) {
	l, f := testLoop(t, 8, false)
	j := job(3, nil)
	require.NoError(t, l.Submit(j))
	step(l)
	f.fail(fabric.ErrKeyRejected)
	f.complete(-1)
	for i := 0; i < 10 && !j.finished; i++ {
		step(l)
	}
	require.True(t, isDone(j))
	require.Len(t, j.Errs, 1)
	var ce *Error
	require.ErrorAs(t, j.Errs[0], &ce)
	assert.Equal(t, fabric.ErrKeyRejected, ce.Errno)
	assert.Equal(t, "injected", ce.ProvMessage)
	assert.Equal(t, 2, j.Completed)
}

func TestLoopCompletionForUnknownOrStaleContext(t *testing.T) {
	l, f := testLoop(t, 4, false)
	j := job(1, nil)
	require.NoError(t, l.Submit(j))
	step(l)
	require.Equal(t, 1, f.inFlight())

	// Slots the loop never handed out, and an error with no op context.
	f.mu.Lock()
	f.done = append(f.done, 3, 77)
	f.errs = append(f.errs, fabric.CQError{Err: fabric.ErrIO, Slot: fabric.NoSlot})
	f.mu.Unlock()
	step(l)
	assert.False(t, isDone(j))
	assert.Equal(t, 0, j.Completed)

	// The job moves to a new generation while its op is out (a bug this
	// check guards against): the late completion must not count for it.
	j.gen.Add(1)
	f.complete(-1)
	step(l)
	assert.Equal(t, 1, l.stale)
	assert.Equal(t, 0, j.Completed)
	assert.Equal(t, 0, l.inflight)
	assert.Len(t, l.free, 4)
}

func TestLoopWedgeDetection(t *testing.T) {
	l, f := testLoop(t, 4, false)
	l.wedgeAfter = 50 * time.Millisecond
	gate := make(chan struct{})
	f.gate, f.blocked = gate, make(chan struct{})
	j := job(1, nil)
	require.NoError(t, l.Submit(j))
	stuck := make(chan struct{})
	go func() {
		defer close(stuck)
		step(l) // blocks inside post, as a libfabric call that never returns
	}()
	<-f.blocked
	start := time.Now()
	err := l.Do(func() { t.Error("Do ran on a wedged endpoint") })
	var we *WedgedError
	require.ErrorAs(t, err, &we)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.ErrorAs(t, l.Wedged(), &we)
	assert.Contains(t, we.Error(), "stuck inside libfabric")
	close(gate)
	<-stuck
	assert.NoError(t, l.Wedged())
}

// TestDeadlineOfABusyJob: a job whose every round completes one of its
// ops, each round slow (a tcp transfer of megabytes on a loaded machine:
// 32 chunks of 8 MiB once ran 659 ms past a 20 ms deadline and returned
// nil), still ends at its deadline, whether its waiter drives the
// endpoint or the loop's goroutine does, and when its waiter's context
// is cancelled.
func TestDeadlineOfABusyJob(t *testing.T) {
	for _, tc := range []struct {
		name   string
		waiter bool
		cancel bool // the context's cancel, not the job's deadline
		want   error
	}{
		{"waiter drives", true, false, context.DeadlineExceeded},
		{"loop drives", false, false, context.DeadlineExceeded},
		{"waiter cancelled", true, true, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakePort()
			f.accept, f.auto, f.slow = 1, true, 2*time.Millisecond
			l := newLoop(f, 4, PollPolicy{Spin: time.Hour}, zerolog.Nop())
			go l.run()
			defer l.Close(nil)
			const n = 200 // 0.4 s at one op a round, in fewer than 256 rounds
			j := job(n, nil)
			j.Start = time.Now()
			ctx := context.Background()
			if tc.cancel {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				defer time.AfterFunc(20*time.Millisecond, cancel).Stop()
			} else {
				j.Deadline = j.Start.Add(20 * time.Millisecond)
			}
			require.NoError(t, l.Submit(j))
			if tc.waiter {
				require.NoError(t, l.Wait(ctx, j))
			} else {
				<-j.done
			}
			require.NotEmpty(t, j.Errs, "the job ended before all its ops")
			assert.ErrorIs(t, j.Errs[0], tc.want)
			assert.Less(t, j.Completed, n)
		})
	}
}

// stuckLoop returns a running loop (passive or not, never wedged) whose
// goroutine is inside a post that returns when gate is closed, posting
// one op of a job whose OnIdle counts into idle (when not nil).
func stuckLoop(t *testing.T, passive bool, idle *atomic.Int32) (*Loop, *fakePort, chan struct{}) {
	return stuckLoopWith(t, passive, idle, PollPolicy{Spin: time.Hour, WedgeAfter: time.Hour})
}

// stuckLoopWith is stuckLoop under policy.
func stuckLoopWith(t *testing.T, passive bool, idle *atomic.Int32, policy PollPolicy) (*Loop, *fakePort, chan struct{}) {
	f := newFakePort()
	f.mayHang = passive
	l := newLoop(f, 4, policy, zerolog.Nop())
	gate := make(chan struct{})
	f.gate, f.blocked = gate, make(chan struct{})
	go l.run()
	t.Cleanup(func() { l.Close(nil) })
	require.NoError(t, l.Submit(job(1, idle)))
	<-f.blocked
	return l, f, gate
}

// TestWaitersKeepTheirDeadline: while the loop's goroutine is inside a
// call that has not returned (one that may never return on libfabric's
// shm; one that returns only at a wedge elsewhere), a waiter's Wait
// ends when its request does, not at the wedge (WedgeAfter, an hour
// here): at its context's end, or at the job's deadline when the context
// has none (transport's requests under the manager's timeout). It leaves
// the job to the loop (Left) — at once on a passive loop, once the call
// has run stuckCall elsewhere — and the loop expires it when the call
// returns, before posting any of it. A passive loop's Poll does not call
// libfabric either.
func TestWaitersKeepTheirDeadline(t *testing.T) {
	for _, passive := range []bool{true, false} {
		for _, end := range []string{"context deadline", "job deadline", "cancel"} {
			t.Run(fmt.Sprintf("passive=%v/%s", passive, end), func(t *testing.T) {
				var idle atomic.Int32
				l, f, gate := stuckLoop(t, passive, &idle)

				j := job(4, &idle)
				j.Start = time.Now()
				ctx, want := context.Background(), error(context.DeadlineExceeded)
				switch end {
				case "context deadline":
					j.Deadline = j.Start.Add(100 * time.Millisecond)
					c, cancel := context.WithDeadline(ctx, j.Deadline)
					defer cancel()
					ctx = c
				case "job deadline":
					j.Deadline = j.Start.Add(100 * time.Millisecond)
				case "cancel":
					j.Deadline = j.Start.Add(time.Hour)
					c, cancel := context.WithCancel(ctx)
					defer time.AfterFunc(100*time.Millisecond, cancel).Stop()
					ctx, want = c, context.Canceled
				}
				require.NoError(t, l.Submit(j))
				if passive {
					assert.False(t, l.Poll())
				}
				start := time.Now()
				err := l.Wait(ctx, j)
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				assert.True(t, te.Left)
				assert.ErrorIs(t, err, want)
				assert.Less(t, time.Since(start), stuckCall+2*time.Second)
				assert.Zero(t, idle.Load(), "both jobs are still the loop's")

				f.setAuto(true, nil) // what is posted completes
				close(gate)          // the call returns
				require.Eventually(t, func() bool { return idle.Load() == 2 }, 5*time.Second, time.Millisecond,
					"the loop ends the job it was left, and lets both go")
				assert.Equal(t, int64(1), f.posted.Load(), "only the stuck job's op went out: the left one's were not posted")
				require.NotEmpty(t, j.Errs)
				assert.ErrorIs(t, j.Errs[0], want)
				assert.Zero(t, l.leftJobs.Load(), "the left mark was taken")
			})
		}
	}
}

// TestWedgedWaiterLeavesItsJob: a waiter that gets a *WedgedError (the
// call it waited behind ran WedgeAfter) leaves its job to the loop:
// should the call return after all, the loop ends the job before posting
// any of it, since its caller has its answer and may use the memory
// again. A waiter driving a loop that is not passive notices the wedge
// too, with no deadline, under a policy that spins for an hour; until
// this test it spun behind the call for as long as the call ran, and the
// left job's four ops went out when the call returned.
func TestWedgedWaiterLeavesItsJob(t *testing.T) {
	for _, passive := range []bool{true, false} {
		t.Run(fmt.Sprintf("passive=%v", passive), func(t *testing.T) {
			var idle atomic.Int32
			l, f, gate := stuckLoopWith(t, passive, &idle, PollPolicy{Spin: time.Hour, WedgeAfter: 200 * time.Millisecond})
			j := job(4, &idle)
			j.Start = time.Now() // and no deadline
			require.NoError(t, l.Submit(j))
			waited := make(chan error, 1)
			go func() { waited <- l.Wait(context.Background(), j) }()
			var err error
			select {
			case err = <-waited:
			case <-time.After(30 * time.Second):
				close(gate)
				t.Fatal("Wait spins behind a wedged call")
			}
			var we *WedgedError
			require.ErrorAs(t, err, &we)

			f.setAuto(true, nil) // what is posted completes
			close(gate)          // the call returns after all
			require.Eventually(t, func() bool { return idle.Load() == 2 }, 10*time.Second, time.Millisecond,
				"the loop ends the job it was left, and lets both go")
			assert.Equal(t, int64(1), f.posted.Load(), "only the stuck job's op went out: the wedged waiter's were not posted")
			require.NotEmpty(t, j.Errs)
			assert.ErrorAs(t, j.Errs[0], &we)
			assert.Zero(t, l.leftJobs.Load(), "the left mark was taken")
		})
	}
}

// TestShutdownDrainIsNoWedge: a shutdown that drains ops in flight (1.x's
// tcp;ofi_rxm) for up to shutdownDrain is no call stuck inside libfabric,
// whatever the policy's WedgeAfter (100 ms here): Close returns nil once
// the loop stopped. Counting the whole shutdown as one call made Close
// report a wedge after 100 ms of a normal drain (a review).
func TestShutdownDrainIsNoWedge(t *testing.T) {
	f := newFakePort()
	f.unsafeClose = true
	l := newLoop(f, 4, PollPolicy{Spin: time.Millisecond, WedgeAfter: 100 * time.Millisecond}, zerolog.Nop())
	go l.run()
	require.NoError(t, l.Submit(job(1, nil)))
	require.Eventually(t, func() bool { return f.inFlight() == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, l.Close(nil))
	assert.True(t, l.Stopped())
}

// TestCloseEndsAWaiterAbortingItsJob: a waiter whose context ended while
// a call held the endpoint (a Do here) waits for the drive lock to abort
// its job. Once Close began, it leaves the job to the shutdown and
// returns a Left timeout instead of waiting for the lock: the shutdown
// ends a job with an op in flight (this one's never completes) only
// after the drain and the endpoint's close, held here until the waiter
// returned. Until this test it returned 0.7-1.1 s past its context's
// end, and then, once the shutdown failed jobs as it began, before the
// shutdown's drain that still moved its bytes
// (TestCloseWakesAWaiterOnlyAfterTheDrain).
func TestCloseEndsAWaiterAbortingItsJob(t *testing.T) {
	for i := 0; i < 5; i++ {
		f := newFakePort()
		l := newLoop(f, 8, PollPolicy{Spin: time.Microsecond, WedgeAfter: time.Hour}, zerolog.Nop())
		go l.run()
		j := job(1, nil) // posted, never completes
		j.Start, j.Deadline = time.Now(), time.Now().Add(time.Hour)
		require.NoError(t, l.Submit(j))
		require.Eventually(t, func() bool { return f.inFlight() == 1 }, 10*time.Second, time.Millisecond)

		holding, release := make(chan struct{}), make(chan struct{})
		go func() { _ = l.Do(func() { close(holding); <-release }) }()
		<-holding
		ctx, cancel := context.WithCancel(context.Background())
		waited := make(chan error, 1)
		go func() { waited <- l.Wait(ctx, j) }()
		cancel()
		require.Eventually(t, func() bool { return l.drivers.Load() == 1 }, 10*time.Second, 10*time.Microsecond, "the waiter waits for the lock")

		inBefore, closeOn := make(chan struct{}), make(chan struct{})
		closed := make(chan error, 1)
		go func() { closed <- l.Close(func() { close(inBefore); <-closeOn }) }()
		select {
		case err := <-waited:
			var te *TimeoutError
			require.ErrorAs(t, err, &te, "round %d", i)
			assert.True(t, te.Left, "round %d: the job is the shutdown's", i)
			assert.True(t, te.Closing, "round %d: left to a close, not to a call", i)
			assert.Contains(t, te.Error(), "the endpoint was closing")
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter waits for the shutdown", i)
		}
		close(release)
		<-inBefore
		close(closeOn)
		require.NoError(t, <-closed)
		// The loop ended the left job: a round that ran before the
		// shutdown expired it, or the shutdown failed it.
		require.True(t, isDone(j), "round %d: the left job never ended", i)
		require.NotEmpty(t, j.Errs)
	}
}

// TestCloseWakesAWaiterOnlyAfterTheDrain: on an endpoint that is unsafe
// to close with ops in flight (1.x's tcp;ofi_rxm), Close's shutdown
// drains, reaping (and so progressing the provider, which moves the ops'
// bytes) for up to shutdownDrain. It failed every job with ErrClosed
// first, waking its waiter: a ReadInto that returned ErrClosed saw about
// 1 MiB land in its destination afterwards, on 1.17. A job with an op in
// flight now ends once its ops completed in the drain or the endpoint is
// closed. From a review; it failed 3 of 3 before.
func TestCloseWakesAWaiterOnlyAfterTheDrain(t *testing.T) {
	for _, completes := range []bool{true, false} {
		t.Run(fmt.Sprintf("completes=%v", completes), func(t *testing.T) {
			f := newFakePort()
			f.unsafeClose = true
			l := newLoop(f, 4, PollPolicy{Spin: time.Millisecond, WedgeAfter: time.Hour}, zerolog.Nop())
			go l.run()
			var idle atomic.Int32
			j := job(1, &idle)
			j.Start = time.Now()
			require.NoError(t, l.Submit(j))
			require.Eventually(t, func() bool { return f.inFlight() == 1 }, 10*time.Second, time.Millisecond)

			waited := make(chan error, 1)
			go func() { waited <- l.Wait(context.Background(), j) }()
			inBefore, closeOn := make(chan struct{}), make(chan struct{})
			closed := make(chan error, 1)
			go func() { closed <- l.Close(func() { close(inBefore); <-closeOn }) }()
			if completes {
				// The drain's reap completes the op, and no round before it.
				f.mu.Lock()
				f.autoIf = func() bool { return l.deferSettle }
				f.mu.Unlock()
			}
			<-inBefore
			if completes {
				require.NoError(t, <-waited, "woken when its op completed in the drain")
				assert.Zero(t, f.inFlight())
			} else {
				select {
				case err := <-waited:
					t.Fatalf("Wait returned %v while its op was still with the provider", err)
				default:
				}
			}
			completed := l.completed.Load()
			close(closeOn)
			require.NoError(t, <-closed)
			if !completes {
				require.NoError(t, <-waited, "woken once the endpoint was closed (abandoned here)")
			}
			assert.Equal(t, completed, l.completed.Load(), "nothing completed after Wait returned")
			require.NotEmpty(t, j.Errs)
			assert.ErrorIs(t, j.Errs[0], ErrClosed)
			assert.Equal(t, int32(1), idle.Load())
		})
	}
}

// TestPassiveLoopRunsWhenAKickEndsItsPause: a passive loop pausing
// between looks at an idle endpoint (attended: it does not park) runs a
// round at once when a waiter's kick ends the pause, instead of handing
// off and waiting for another kick: the waiter kicks once and parks, so
// its op sat out the hand-off's pause, max(MaxSleep, 1ms): an hour here,
// and the op ended at its deadline instead (until this test; 0.9 ms on
// average under the default policy).
func TestPassiveLoopRunsWhenAKickEndsItsPause(t *testing.T) {
	f := newFakePort()
	f.mayHang = true
	f.setAuto(true, nil)
	l := newLoop(f, 4, PollPolicy{Spin: time.Microsecond, MinSleep: time.Microsecond, MaxSleep: time.Hour}, zerolog.Nop())
	l.ParkWhenUnattended()
	defer l.Attend()() // a peer attends: an idle loop pauses between looks instead of parking
	go l.run()
	defer l.Close(nil)
	for i := 0; i < 3; i++ {
		// An idle spell, which is what this test is about (not a wait
		// for a signal): past Spin and the hand-off window after the
		// last Wait (MinSleep+1ms), the loop pauses for longer and
		// longer, up to MaxSleep.
		time.Sleep(50 * time.Millisecond)
		j := job(1, nil)
		j.Start, j.Deadline = time.Now(), time.Now().Add(10*time.Second)
		require.NoError(t, l.Submit(j))
		require.NoError(t, l.Wait(context.Background(), j))
		require.Empty(t, j.Errs, "op %d ended at its deadline: the loop waited for another kick", i)
	}
}

// TestCancelUnderABusyDriver: a waiter whose context ends while another
// waiter drives slow rounds (tcp moving megabytes), with no call stuck,
// aborts its job itself: Wait returns with the job finished, nothing
// left to the loop.
func TestCancelUnderABusyDriver(t *testing.T) {
	f := newFakePort()
	f.slow = 5 * time.Millisecond
	l := newLoop(f, 64, PollPolicy{Spin: time.Hour, WedgeAfter: time.Hour}, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	busy := job(40, nil) // completes only when told: its driver reaps slowly, for as long as the test runs
	require.NoError(t, l.Submit(busy))
	driving := make(chan error, 1)
	go func() { driving <- l.Wait(context.Background(), busy) }()

	j := job(4, nil)
	j.Start, j.Deadline = time.Now(), time.Now().Add(time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(50*time.Millisecond, cancel).Stop()
	require.NoError(t, l.Submit(j))
	require.NoError(t, l.Wait(ctx, j), "the waiter aborted its job itself")
	require.NotEmpty(t, j.Errs)
	var te *TimeoutError
	require.ErrorAs(t, j.Errs[0], &te)
	assert.False(t, te.Left)
	assert.ErrorIs(t, te, context.Canceled)

	f.setAuto(true, nil)
	require.NoError(t, <-driving)
}

// TestDoByKeepsItsDeadline: a request's DoBy (inserting a peer,
// registering memory) gives up at its deadline, or when its context
// ends, while the loop's goroutine is inside a call that has not
// returned, instead of waiting for the wedge (WedgeAfter); fn does not
// run then. Once the call returns, DoBy runs fn.
func TestDoByKeepsItsDeadline(t *testing.T) {
	for _, passive := range []bool{true, false} {
		for _, cancelled := range []bool{false, true} {
			t.Run(fmt.Sprintf("passive=%v/cancelled=%v", passive, cancelled), func(t *testing.T) {
				l, f, gate := stuckLoop(t, passive, nil)

				ctx, deadline, want := context.Background(), time.Now().Add(100*time.Millisecond), context.DeadlineExceeded
				if cancelled {
					c, cancel := context.WithCancel(ctx)
					defer time.AfterFunc(100*time.Millisecond, cancel).Stop()
					ctx, deadline, want = c, time.Time{}, context.Canceled
				}
				ran := false
				start := time.Now()
				err := l.DoBy(ctx, deadline, func() { ran = true })
				var te *TimeoutError
				require.ErrorAs(t, err, &te)
				assert.True(t, te.Busy)
				assert.ErrorIs(t, err, want)
				assert.Equal(t, !cancelled, errors.Is(err, errclass.ErrTimeout), "a deadline is a timeout, a cancel is not")
				assert.Less(t, time.Since(start), 2*time.Second)
				assert.False(t, ran, "fn ran without the endpoint")

				f.setAuto(true, nil)
				close(gate) // the call returns
				require.NoError(t, l.DoBy(context.Background(), time.Now().Add(time.Minute), func() { ran = true }))
				assert.True(t, ran)
			})
		}
	}
}

// TestPassiveLoopHandsOff: the goroutine of a passive loop (libfabric
// 1.x's shm) whose callers wait for it runs a round per caller's kick
// and otherwise waits, instead of spinning beside them on another thread
// (on a small machine, the spinning pair and a peer's took turns at the
// CPUs: docs/ARCHITECTURE.md): about one round per job waited for and per
// Poll, under a policy that would spin for an hour.
func TestPassiveLoopHandsOff(t *testing.T) {
	const n = 500
	f := newFakePort()
	f.mayHang, f.auto = true, true
	// MinSleep sets how long after its callers' last call the loop hands
	// off (MinSleep + 1ms): an hour, so that a test goroutine descheduled
	// for a millisecond on a loaded machine does not end it.
	l := newLoop(f, 4, PollPolicy{Spin: time.Hour, MinSleep: time.Hour}, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	ctx := context.Background()
	j := job(1, nil)
	require.NoError(t, l.Submit(j))
	require.NoError(t, l.Wait(ctx, j))
	// A caller's call, whether or not Wait found the job done before it
	// looked (on a loaded machine the loop can finish it first, and
	// Wait then returns without counting as a caller).
	l.Poll()
	require.Eventually(t, l.handing.Load, 10*time.Second, time.Millisecond, "the loop waits for its callers")

	reaps := f.reaps.Load()
	for i := 0; i < n; i++ {
		j := job(1, nil)
		require.NoError(t, l.Submit(j))
		require.NoError(t, l.Wait(ctx, j))
	}
	for i := 0; i < n; i++ {
		l.Poll()
	}
	// About 2n rounds: one per job and one per Poll.
	rounds := f.reaps.Load() - reaps
	assert.LessOrEqual(t, rounds, int64(3*n), "rounds of progress for %d jobs and %d polls", n, n)
}

// TestPassiveLoopOpsInFlight: a passive loop whose ops take more than
// the round that posted them keeps running rounds while its callers poll
// and wait (they cannot progress it themselves): each Poll meets a round.
func TestPassiveLoopOpsInFlight(t *testing.T) {
	f := newFakePort()
	f.mayHang = true
	l := newLoop(f, 4, DefaultPollPolicy, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	var idle atomic.Int32
	j := job(1, &idle)
	require.NoError(t, l.Submit(j))
	require.Eventually(t, func() bool { l.Poll(); return f.posted.Load() == 1 }, 10*time.Second, time.Millisecond)
	met := 0
	for i := 0; i < 20; i++ {
		if l.Poll() {
			met++
		}
	}
	// Each Poll waits up to pollBound for a round. A loop that left its
	// op to its pollers met about half: it ran a round only when their
	// stamps happened to lie more than a millisecond apart. One that
	// spins while its op is in flight meets them all.
	assert.GreaterOrEqual(t, met, 16, "Polls that met a round, of 20, with an op in flight")
	f.setAuto(true, nil) // completes at the next round
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, l.Wait(ctx, j))
	assert.Empty(t, j.Errs, "the op completed, nothing expired")
}

// TestPollIfWanted: a caller spinning on memory polls an idle endpoint that
// counts peers' ops at most every idlePollEvery (a round of an idle 1.x
// shm endpoint costs microseconds), one with ops in flight at every look,
// a peer's op on an idle endpoint makes it active, and an endpoint that
// cannot count peers' ops is polled at every look.
func TestPollIfWanted(t *testing.T) {
	const n = 20000
	f := newFakePort()
	f.counted = true
	// The background goroutine sleeps: the rounds counted are the
	// spinning caller's.
	l := newLoop(f, 4, PollPolicy{MinSleep: time.Hour, MaxSleep: time.Hour}, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	spin := func() (rounds int64, elapsed time.Duration) {
		reaps, start := f.reaps.Load(), monoNow()
		for i := 0; i < n; i++ {
			l.PollIfWanted()
		}
		return f.reaps.Load() - reaps, time.Duration(monoNow() - start)
	}
	rounds, elapsed := spin()
	assert.LessOrEqual(t, rounds, 2+int64(elapsed/idlePollEvery), "rounds of %d looks at an idle endpoint in %v", n, elapsed)

	f.remote.Add(1) // a peer's op
	before := l.activeAt.Load()
	require.Eventually(t, func() bool {
		l.PollIfWanted()
		return l.activeAt.Load() > before
	}, 10*time.Second, time.Microsecond, "a peer's op did not make the endpoint active")

	var idle atomic.Int32
	j := job(1, &idle) // never completes: in flight throughout
	require.NoError(t, l.Submit(j))
	require.Eventually(t, func() bool { l.Poll(); return f.posted.Load() == 1 }, 10*time.Second, time.Millisecond)
	rounds, _ = spin()
	assert.GreaterOrEqual(t, rounds, int64(n)-50, "rounds of %d looks with an op in flight (the background goroutine may hold the lock at a few)", n)
	f.setAuto(true, nil)
	require.NoError(t, l.Wait(context.Background(), j))

	// An endpoint that cannot tell peers' ops (tcp) is polled at every
	// look: a spinning target's polls land a peer's writes there.
	g := newFakePort()
	u := newLoop(g, 4, PollPolicy{MinSleep: time.Hour, MaxSleep: time.Hour}, zerolog.Nop())
	go u.run()
	defer u.Close(nil)
	reaps := g.reaps.Load()
	for i := 0; i < n; i++ {
		u.PollIfWanted()
	}
	assert.GreaterOrEqual(t, g.reaps.Load()-reaps, int64(n)-50, "rounds of %d looks at an idle endpoint without a remote count", n)
}

// TestLoopCloseReportsWedge: Close on an endpoint stuck in a libfabric
// call returns the *WedgedError within about WedgeAfter, instead of
// waiting forever or reporting a clean close; the loop still stops once
// the call returns.
func TestLoopCloseReportsWedge(t *testing.T) {
	f := newFakePort()
	l := newLoop(f, 4, PollPolicy{Spin: time.Hour, WedgeAfter: 50 * time.Millisecond}, zerolog.Nop())
	gate := make(chan struct{})
	f.gate, f.blocked = gate, make(chan struct{})
	go l.run()
	require.NoError(t, l.Submit(job(1, nil)))
	<-f.blocked
	start := time.Now()
	err := l.Close(nil)
	var we *WedgedError
	require.ErrorAs(t, err, &we)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.False(t, l.Stopped())
	close(gate)
	<-l.exited
	assert.NoError(t, l.Close(nil), "closing again, once stopped")
}

func TestLoopCloseFailsPendingJobs(t *testing.T) {
	l, _ := testLoop(t, 4, true)
	var idle atomic.Int32
	j := job(2, &idle)
	j.Chunks = append(j.Chunks, j.Chunks...) // posted or not, Close ends it
	require.NoError(t, l.Submit(j))
	l.Close(nil)
	require.True(t, isDone(j))
	assert.ErrorIs(t, j.Errs[len(j.Errs)-1], ErrClosed)
	assert.Equal(t, int32(1), idle.Load())
	assert.ErrorIs(t, l.Submit(job(1, nil)), ErrClosed)
}

// TestShutdownSettlesAfterItsDrain: on an endpoint unsafe to close with
// ops in flight (1.x's tcp;ofi_rxm) shutdown reaps their completions
// first; a job it failed whose last op completes in that drain is settled
// once, after it, with the others. Settled in the drain, the job went back
// to its submitter (OnIdle), which reset it for reuse while shutdown still
// wrote it: a data race in local CI
// (transport's TestCloseFailsTransfersWithErrClosed/tcp;ofi_rxm, 1.17).
func TestShutdownSettlesAfterItsDrain(t *testing.T) {
	l, f := testLoop(t, 4, false)
	f.unsafeClose = true
	var errs []error
	idles := 0
	reused := make(chan struct{})
	j := job(1, nil)
	j.OnIdle = func(j *Job) {
		idles++
		errs = append(errs, j.Errs...)
		// The submitter's release: the job is its own again.
		go func() { j.Reset(); close(reused) }()
	}
	require.NoError(t, l.Submit(j))
	step(l)
	require.Equal(t, 1, f.inFlight(), "the op is in flight")
	f.setAuto(true, nil) // the drain's reap completes it
	l.drive.Lock()
	l.shutdown()
	l.drive.Unlock()
	<-reused
	assert.Equal(t, 1, idles)
	require.Len(t, errs, 1)
	assert.ErrorIs(t, errs[0], ErrClosed)
}

// TestLoopRandomized runs many goroutines' jobs through one loop whose
// fake queue completes ops in random bunches, with random deadlines and
// cancellations, reusing every job as transport does: every finished job
// without errors must have completed every chunk, and OnIdle runs once
// per use.
func TestLoopRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err)
		seed = v
	}
	t.Logf("seed %d (replay with TEST_SEED=%d)", seed, seed)
	for _, passive := range []bool{false, true} {
		for _, noPeers := range []bool{false, true} {
			t.Run(fmt.Sprintf("passive=%v/servesNoPeers=%v", passive, noPeers), func(t *testing.T) {
				randomizedLoop(t, seed, passive, noPeers)
			})
		}
	}
}

// randomizedLoop is TestLoopRandomized's run, over a loop that is passive
// or not (its callers never call the endpoint) and serves peers or not
// (ServesNoPeers: its goroutine leaves quiet spells to the waiters).
func randomizedLoop(t *testing.T, seed uint64, passive, noPeers bool) {
	f := newFakePort()
	f.mayHang = passive
	l := newLoop(f, 32, BusyPollPolicy, zerolog.Nop())
	if noPeers {
		l.ServesNoPeers()
	}
	go l.run()
	t.Cleanup(func() { l.Close(nil) })
	f.setAuto(true, rand.New(rand.NewPCG(seed, 1)))
	const workers, rounds = 6, 300
	var violations atomic.Int32
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)+2))
			var idle atomic.Int32
			j := NewJob()
			j.OnIdle = func(*Job) { idle.Add(1) }
			for i := 0; i < rounds; i++ {
				j.Reset()
				fillJob(j, 1+r.IntN(80), uintptr(w)<<20)
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				switch r.IntN(4) {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(200))*time.Microsecond)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					cancel()
				case 2:
					j.Deadline = time.Now().Add(time.Duration(r.IntN(300)) * time.Microsecond)
				}
				before := idle.Load()
				if err := l.Submit(j); err != nil {
					t.Errorf("worker %d round %d: submit: %v", w, i, err)
					cancel()
					return
				}
				err := l.Wait(ctx, j)
				cancel()
				var left *TimeoutError
				if passive && errors.As(err, &left) && left.Left {
					// A waiter on a passive loop gives up on the drive
					// lock after abortWait (the loop's thread descheduled
					// meanwhile): the job is the loop's until idle.
					for idle.Load() == before {
						time.Sleep(10 * time.Microsecond)
					}
					continue
				}
				if err != nil {
					t.Errorf("worker %d round %d: wait: %v", w, i, err)
				}
				if len(j.Errs) == 0 && j.Completed != len(j.Chunks) {
					violations.Add(1)
					t.Errorf("seed %d worker %d round %d: finished without error after %d of %d chunks",
						seed, w, i, j.Completed, len(j.Chunks))
				}
				for _, e := range j.Errs {
					var te *TimeoutError
					if !errors.As(e, &te) {
						t.Errorf("seed %d worker %d round %d: unexpected error %v", seed, w, i, e)
					}
				}
				// The transport releases a job once it is idle: wait for it.
				for idle.Load() == before {
					time.Sleep(10 * time.Microsecond)
				}
				if got := idle.Load(); got != before+1 {
					t.Errorf("seed %d worker %d round %d: OnIdle ran %d times", seed, w, i, got-before)
				}
			}
		}(w)
	}
	wg.Wait()
	l.drive.Lock()
	stale := l.stale
	l.drive.Unlock()
	assert.Equal(t, 0, stale, "completions that reached a reused job")
	assert.Equal(t, int32(0), violations.Load())
}

// TestLoopServingNoPeers: the goroutine of a loop that serves no peers
// (ServesNoPeers), busy policy, does not spin once its waiter took its op
// through: it looks about once a millisecond. A job submitted with nobody
// waiting still runs, at once when nudged, and a waiter that gives up on
// a slow op leaves it to the goroutine, which finishes it.
func TestLoopServingNoPeers(t *testing.T) {
	f := newFakePort()
	f.setAuto(true, nil)
	l := newLoop(f, 4, BusyPollPolicy, zerolog.Nop())
	l.ServesNoPeers()
	go l.run()
	defer l.Close(nil)
	ctx := context.Background()
	for i := 0; i < 100; i++ {
		j := job(1, nil)
		require.NoError(t, l.Submit(j))
		require.NoError(t, l.Wait(ctx, j))
	}
	before, start := f.reaps.Load(), time.Now()
	time.Sleep(100 * time.Millisecond) // a span to count rounds in, not a readiness wait
	rounds, spell := f.reaps.Load()-before, time.Since(start)
	// At most one round a millisecond, plus the round under way: a
	// spinning goroutine runs hundreds a millisecond.
	assert.LessOrEqual(t, rounds, int64(spell/time.Millisecond)+2, "rounds in %v after the last op", spell)

	j := job(2, nil)
	requireRunsUnwaited(t, l, j, "a job submitted with nobody waiting did not run")
	assert.Equal(t, 2, j.Completed)

	// Pausing an hour between its waiters' ops (MaxSleep), it takes a
	// job submitted with nobody waiting at a Nudge.
	h := newFakePort()
	h.setAuto(true, nil)
	n := newLoop(h, 4, PollPolicy{Spin: time.Hour, MaxSleep: time.Hour}, zerolog.Nop())
	n.ServesNoPeers()
	go n.run()
	defer n.Close(nil)
	first := job(1, nil)
	require.NoError(t, n.Submit(first))
	require.NoError(t, n.Wait(ctx, first))
	nudged := job(1, nil)
	require.NoError(t, n.Submit(nudged))
	n.Nudge()
	select {
	case <-nudged.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a nudged loop did not take the job")
	}

	// A waiter that gives up (Spin without a completion) leaves the op to
	// the goroutine, which is not quiet then.
	g := newFakePort()
	// Spin long enough that the check below cannot miss the waiter
	// driving on a loaded machine.
	s := newLoop(g, 4, PollPolicy{Spin: 2 * time.Second}, zerolog.Nop())
	s.ServesNoPeers()
	go s.run()
	defer s.Close(nil)
	slow := job(1, nil)
	require.NoError(t, s.Submit(slow))
	waited := make(chan error, 1)
	go func() { waited <- s.Wait(ctx, slow) }()
	require.Eventually(t, func() bool { return s.drivers.Load() == 1 }, 10*time.Second, 100*time.Microsecond,
		"the waiter did not drive")
	require.Eventually(t, func() bool { return g.posted.Load() == 1 && s.drivers.Load() == 0 }, 10*time.Second, 100*time.Microsecond,
		"the waiter did not leave the slow op to the goroutine")
	g.setAuto(true, nil)
	select {
	case err := <-waited:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the goroutine did not finish an op its waiter left")
	}
	checkFinished(t, slow)
}

// TestPassiveLoopServingNoPeers: a passive loop that serves no peers
// (libfabric's shm: 2.x's Outgoing endpoint) pauses between its waiters'
// ops (an hour here: MaxSleep), and a waiter's kick ends the pause with a
// round: its job does not then sit out a hand-off's pause of the same
// hour waiting for a second kick. With the busy policy it does not spin
// once its waiters' ops are through.
func TestPassiveLoopServingNoPeers(t *testing.T) {
	noPeers := func(l *Loop, _ *fakePort) { l.ServesNoPeers() }
	l, _ := startPassive(t, PollPolicy{Spin: time.Hour, MaxSleep: time.Hour}, noPeers)
	for i := 0; i < 20; i++ {
		// Past the hand-off's millisecond after the last Wait, a nudge
		// ends the hand-off's pause (an hour too), and the goroutine
		// pauses next as serving no peers: spans, not readiness waits.
		time.Sleep(3 * time.Millisecond)
		l.Nudge()
		time.Sleep(3 * time.Millisecond)
		j := job(1, nil)
		require.NoError(t, l.Submit(j))
		waited := make(chan error, 1)
		go func() { waited <- l.Wait(context.Background(), j) }()
		select {
		case err := <-waited:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("op %d: its waiter's kick did not bring a round", i)
		}
	}

	busy, b := startPassive(t, BusyPollPolicy, noPeers)
	for i := 0; i < 100; i++ {
		j := job(1, nil)
		require.NoError(t, busy.Submit(j))
		require.NoError(t, busy.Wait(context.Background(), j))
	}
	before, start := b.reaps.Load(), time.Now()
	time.Sleep(100 * time.Millisecond) // a span to count rounds in, not a readiness wait
	rounds, spell := b.reaps.Load()-before, time.Since(start)
	// The hand-off's millisecond after the last Wait, then at most one
	// round a millisecond, plus the round under way: a spinning
	// goroutine runs hundreds a millisecond.
	assert.LessOrEqual(t, rounds, int64(spell/time.Millisecond)+4, "rounds in %v after the last op", spell)
}

// TestDoAfterRoundsOnAPassiveLoop: DoAfterRoundBy on a passive loop (its
// callers never progress the endpoint) runs fn only after three rounds
// of the loop's goroutine begun after its call — the goroutine parked
// at the call, or inside a round then, which does not count — and
// gives up at its deadline while the goroutine is inside a call that
// has not returned, without running fn.
func TestDoAfterRoundsOnAPassiveLoop(t *testing.T) {
	l, f := startPassive(t, PollPolicy{Spin: time.Millisecond, MaxSleep: time.Hour},
		func(l *Loop, _ *fakePort) { l.ParkWhenUnattended() })
	roundsBeforeFn := func(l *Loop, f *fakePort, i int) {
		t.Helper()
		before := f.reaps.Load() // a reap under way at the call counted already
		var at int64
		require.NoError(t, l.DoAfterRoundBy(context.Background(), time.Now().Add(10*time.Second), func() { at = f.reaps.Load() }))
		assert.GreaterOrEqual(t, at-before, int64(3), "rounds begun after the call, before fn (call %d)", i)
	}
	for i := 0; i < 3; i++ {
		require.Eventually(t, func() bool { return l.parked.Load() }, 10*time.Second, 100*time.Microsecond,
			"the goroutine parks past Spin")
		roundsBeforeFn(l, f, i)
	}

	// Rounds of 20 ms, one after another: each call comes inside one.
	busy, s := startPassive(t, PollPolicy{Spin: time.Hour}, func(_ *Loop, f *fakePort) { f.slow = 20 * time.Millisecond })
	for i := 0; i < 3; i++ {
		roundsBeforeFn(busy, s, i)
		// Three whole rounds from the call, each 20 ms of sleep: not
		// what is left of the one under way and two more.
		start := time.Now()
		require.NoError(t, busy.awaitRounds(context.Background(), time.Time{}, 3))
		assert.GreaterOrEqual(t, time.Since(start), 3*s.slow, "awaitRounds(3) returned before three whole rounds (call %d)", i)
	}

	stuck, _, gate := stuckLoop(t, true, nil)
	defer close(gate)
	ran := false
	start := time.Now()
	err := stuck.DoAfterRoundBy(context.Background(), time.Now().Add(50*time.Millisecond), func() { ran = true })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "had not run 3 rounds")
	assert.False(t, ran)
	assert.Less(t, time.Since(start), 5*time.Second, "the error comes at the deadline, not at the call's end")
}

// startPassive starts a passive loop (its callers never call the port)
// over a fake port whose ops complete at the next reap, with policy;
// setup, when not nil, runs before the loop's goroutine starts.
func startPassive(t *testing.T, policy PollPolicy, setup func(*Loop, *fakePort)) (*Loop, *fakePort) {
	t.Helper()
	f := newFakePort()
	f.mayHang = true
	f.setAuto(true, nil)
	l := newLoop(f, 4, policy, zerolog.Nop())
	require.True(t, l.passive)
	if setup != nil {
		setup(l, f)
	}
	go l.run()
	t.Cleanup(func() { l.Close(nil) })
	return l, f
}

// TestIdleLoopBlocksInWaitObject: a loop with nothing to do, over a CQ
// that wakes on traffic, blocks in the CQ's wait object instead of
// polling it every MaxSleep (about a thousand rounds a second, most of an
// idle manager's CPU); a wait is not a stuck call; and an op submitted
// after the idle spell still completes, its waiter signalling the wait
// out.
func TestIdleLoopBlocksInWaitObject(t *testing.T) {
	f := newFakePort()
	f.canWait = true
	policy := DefaultPollPolicy
	policy.WedgeAfter = 200 * time.Millisecond // well within one wait
	l := newLoop(f, 4, policy, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	require.Eventually(t, func() bool { return f.waits.Load() > 0 }, 10*time.Second, time.Millisecond,
		"the loop never waited in the CQ")
	before := f.reaps.Load()
	var wedged error
	for end := time.Now().Add(time.Second); time.Now().Before(end) && wedged == nil; time.Sleep(5 * time.Millisecond) {
		wedged = l.Wedged()
	}
	rounds := f.reaps.Load() - before
	assert.LessOrEqual(t, rounds, int64(5), "rounds of progress in a second of idleness")
	assert.NoError(t, wedged, "waiting for traffic is not a call stuck inside libfabric")

	f.setAuto(true, nil)
	j := job(3, nil)
	require.NoError(t, l.Submit(j))
	require.NoError(t, l.Wait(context.Background(), j))
	assert.Empty(t, j.Errs)
	assert.Equal(t, 3, j.Completed)
	require.NoError(t, l.Close(nil))
}

// TestBlockedLoopWakeUps: what wakes a loop blocked on its CQ's fd, and
// whether that is activity. Traffic completes nothing of the loop's own
// (a peer's RMA on a target) yet is: the loop polls for the policy's Spin
// before it waits again, so a peer that keeps the target busy pays no
// wake-up per op. The signal of a goroutine that drove the endpoint
// meanwhile (Do, Poll; Wait too) is not: it only makes the loop look
// again, and it waits again at once.
func TestBlockedLoopWakeUps(t *testing.T) {
	f := newFakePort()
	f.canWait = true
	policy := DefaultPollPolicy
	policy.Spin = time.Second
	l := newLoop(f, 4, policy, zerolog.Nop())
	l.parkFor = time.Hour
	go l.run()
	defer l.Close(nil)
	parked := func() bool { return l.Parked() && l.sleeping.Load() }
	for _, tc := range []struct {
		name   string
		wake   func()
		active bool
	}{
		{"traffic", func() { f.traffic <- struct{}{} }, true},
		{"Do", func() { require.NoError(t, l.Do(func() {})) }, false},
		{"Poll", func() { l.Poll() }, false},
	} {
		require.Eventually(t, parked, 10*time.Second, time.Millisecond)
		waits, reaps := f.waits.Load(), f.reaps.Load()
		tc.wake()
		require.Eventually(t, func() bool { return f.waits.Load() > waits }, 10*time.Second, time.Millisecond,
			"%s: the loop did not wait again", tc.name)
		// Spin is a second of polling: thousands of rounds, against
		// the loop's one look (and Poll's own) of a loop that went
		// straight back to its wait.
		rounds := f.reaps.Load() - reaps
		if tc.active {
			assert.Greater(t, rounds, int64(100), "%s: rounds of progress before the next wait", tc.name)
		} else {
			assert.LessOrEqual(t, rounds, int64(3), "%s: rounds of progress before the next wait", tc.name)
		}
	}
}

// TestRemoteOpsKeepTargetPolling: on an endpoint with no wait fd, peers'
// RMA ops that its remote counter saw count as activity too: a loop that
// had slowed to a poll a second polls without pause again.
func TestRemoteOpsKeepTargetPolling(t *testing.T) {
	f := newFakePort()
	f.counted = true
	policy := PollPolicy{Spin: 300 * time.Millisecond, MinSleep: time.Second, MaxSleep: time.Second}
	l := newLoop(f, 4, policy, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	slowed := func() bool {
		l.drive.Lock()
		defer l.drive.Unlock()
		return time.Duration(monoNow()-l.lastActive) > policy.Spin
	}
	require.Eventually(t, slowed, 10*time.Second, time.Millisecond)
	reaps := f.reaps.Load()

	f.remote.Add(1)
	// Polling once a second, the loop would have about 10 rounds in the
	// 10 s; spinning for Spin, thousands.
	require.Eventually(t, func() bool { return f.reaps.Load()-reaps > 100 }, 10*time.Second, time.Millisecond,
		"the loop did not poll without pause after peers' ops")
}

// TestUnattendedLoopParks: a loop with no wait object whose peers
// announce themselves (ParkWhenUnattended) stops polling while no one
// attends; an Attend makes it poll again at once, and once released it
// parks again; a job submitted to the parked loop with nobody waiting
// for it still runs (Submit wakes it).
func TestUnattendedLoopParks(t *testing.T) {
	f := newFakePort()
	l := newLoop(f, 4, DefaultPollPolicy, zerolog.Nop())
	l.parkFor = time.Hour // nothing but what the test does wakes it
	l.ParkWhenUnattended()
	go l.run()
	defer l.Close(nil)
	require.Eventually(t, l.Parked, 10*time.Second, time.Millisecond)
	before := f.reaps.Load()
	time.Sleep(time.Second)
	assert.LessOrEqual(t, f.reaps.Load()-before, int64(1), "rounds of progress in a second parked")

	release := l.Attend()
	before = f.reaps.Load()
	require.Eventually(t, func() bool { return f.reaps.Load()-before >= 50 }, 10*time.Second, time.Millisecond,
		"an attended loop polls")
	assert.False(t, l.Parked())
	release()
	release() // once only
	assert.Equal(t, int32(0), l.attending.Load())
	require.Eventually(t, l.Parked, 10*time.Second, time.Millisecond)

	f.setAuto(true, nil)
	j := job(2, nil)
	requireRunsUnwaited(t, l, j, "a job submitted to a parked loop did not run")
	assert.Equal(t, 2, j.Completed)
	require.NoError(t, l.Close(nil))
}

// TestParkedWaitCallersGetIn: a loop parked in its CQ's wait object (for
// an hour here) lets Do in, runs a job submitted with nobody waiting for
// it, and closes, each without waiting for the wait's timeout: they signal
// it out.
func TestParkedWaitCallersGetIn(t *testing.T) {
	f := newFakePort()
	f.canWait = true
	l := newLoop(f, 4, DefaultPollPolicy, zerolog.Nop())
	l.parkFor = time.Hour
	go l.run()
	parked := func() bool { return l.Parked() && l.sleeping.Load() }
	require.Eventually(t, parked, 10*time.Second, time.Millisecond)

	ran := false
	require.NoError(t, l.Do(func() { ran = true }))
	assert.True(t, ran)
	require.Eventually(t, parked, 10*time.Second, time.Millisecond)

	f.setAuto(true, nil)
	j := job(2, nil)
	requireRunsUnwaited(t, l, j, "a job submitted to a parked loop did not run")
	require.Eventually(t, parked, 10*time.Second, time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- l.Close(nil) }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for the parked wait")
	}
}

// TestQuietSpinnersYieldTheCPU: a waiter spinning on a job and a loop
// spinning after activity give their CPU to the OS scheduler once they
// have seen nothing for quietAfter (yieldCPU), so that the thread they
// wait for is not queued behind them on the same CPU; a target whose
// peers' ops keep coming does not.
func TestQuietSpinnersYieldTheCPU(t *testing.T) {
	// A waiter, with no background goroutine: only Wait spins.
	l, f := testLoop(t, 4, false)
	j := job(1, nil)
	require.NoError(t, l.Submit(j))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel) // a failed check must not leave Wait spinning
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, j) }()
	require.Eventually(t, func() bool { return l.cpuYields.Load() > 0 }, 10*time.Second, time.Millisecond,
		"a waiter spinning on an op that does not complete never yielded its CPU")
	f.setAuto(true, nil)
	require.NoError(t, <-done)
	checkFinished(t, j)

	// The background goroutine, spinning (busy policy) with nothing to do.
	idle, _ := testLoop(t, 4, true)
	require.Eventually(t, func() bool { return idle.cpuYields.Load() > 0 }, 10*time.Second, time.Millisecond,
		"a spinning loop with nothing to do never yielded its CPU")

	// A target whose peers' ops keep coming (its remote counter moves
	// between any two looks) is not quiet.
	tg, g := testLoop(t, 4, false)
	g.counted, g.peerStream, tg.counted = true, true, true
	go tg.run()
	t.Cleanup(func() { tg.Close(nil) })
	require.Eventually(t, func() bool { return g.remote.Load() > 1000 }, 10*time.Second, time.Millisecond,
		"the spinning target did not look at its remote counter")
	assert.Zero(t, tg.cpuYields.Load(), "a target serving a stream of peers' ops yielded its CPU")
}

// TestDriversYieldTheirThread: goroutines that drive the endpoint in
// short Waits, one small op after another, or poll it, yield their
// thread to the Go scheduler now and then (yieldShared), and so does the
// loop's goroutine running a long job whose every round completes
// something: one that never does, mostly inside cgo calls, has its P
// retaken by sysmon every 10 ms, which keeps sysmon waking every few
// tens of microseconds. They yield at most once every yieldEvery.
func TestDriversYieldTheirThread(t *testing.T) {
	atMost := func(l *Loop, since time.Time) {
		t.Helper()
		assert.LessOrEqual(t, l.goYields.Load(), uint64(time.Since(since)/yieldEvery)+1, "yields more often than every %v", yieldEvery)
	}

	l, f := testLoop(t, 4, false)
	f.setAuto(true, nil)
	ctx := context.Background()
	j := job(1, nil)
	start := time.Now()
	for end := start.Add(10 * time.Second); l.goYields.Load() < 3; {
		require.False(t, time.Now().After(end), "a goroutine waiting for one short op after another never yielded its thread")
		j.Reset()
		fillJob(j, 1, 0)
		require.NoError(t, l.Submit(j))
		require.NoError(t, l.Wait(ctx, j))
		checkFinished(t, j)
	}
	atMost(l, start)

	p, _ := testLoop(t, 4, false)
	start = time.Now()
	for end := start.Add(10 * time.Second); p.goYields.Load() < 3; {
		require.False(t, time.Now().After(end), "a goroutine polling the endpoint never yielded its thread")
		p.Poll()
	}
	atMost(p, start)

	// The loop's goroutine, with nobody waiting: one chunk a round, each
	// round a millisecond (a reap moving megabytes).
	bg, g := testLoop(t, 1, false)
	g.accept, g.auto, g.slow = 1, true, time.Millisecond
	long := job(20, nil)
	// Counted as it finishes: the idle loop's goroutine yields after.
	var atFinish atomic.Int64
	atFinish.Store(-1)
	long.OnIdle = func(*Job) { atFinish.Store(int64(bg.goYields.Load())) }
	start = time.Now()
	require.NoError(t, bg.Submit(long))
	go bg.run()
	t.Cleanup(func() { bg.Close(nil) })
	require.Eventually(t, func() bool { return atFinish.Load() >= 0 }, 10*time.Second, time.Millisecond, "the long job did not finish")
	checkFinished(t, long)
	assert.GreaterOrEqual(t, atFinish.Load(), int64(3), "the loop's goroutine running a long job never yielded its thread")
	atMost(bg, start)
}

// TestLeftJobInTheInbox: a waiter that leaves its job while the round
// holding the drive lock is past its intake (the job was submitted after
// it, and is still in the inbox) has the job expired by the next round,
// before any of it is posted; the count of left jobs stays true (a mark
// set on a job that had finished does not hide a later one).
func TestLeftJobInTheInbox(t *testing.T) {
	l, f := testLoop(t, 8, false)
	var idle atomic.Int32
	finished := job(1, &idle)
	l.leave(finished, finished.gen.Load(), context.Canceled) // a mark its job's finish will never take
	j := job(4, &idle)
	j.Start = time.Now()
	l.drive.Lock() // a round, past its intake
	l.intake(monoNow())
	require.NoError(t, l.Submit(j))
	l.leave(j, j.gen.Load(), context.Canceled)
	if l.leftJobs.Load() > 0 {
		l.expireLeft()
	}
	l.drive.Unlock()
	step(l) // the next round takes j in
	assert.True(t, j.finished, "the left job is expired before posting")
	assert.Zero(t, f.posted.Load(), "none of the left job was posted")
	require.NotEmpty(t, j.Errs)
	assert.ErrorIs(t, j.Errs[0], context.Canceled)
	step(l)
	assert.Zero(t, l.leftJobs.Load())

	k := job(4, &idle)
	k.Start = time.Now()
	require.NoError(t, l.Submit(k))
	step(l) // posted; nothing completes
	l.leave(k, k.gen.Load(), context.Canceled)
	step(l)
	assert.True(t, k.finished, "a later left job is expired in the next round")
	assert.Zero(t, l.leftJobs.Load())
}

// TestDeadlineOfAJobPostedInline: a job whose ops its provider moves
// inside the post call (2.1's tcp sending while the reader drains the
// socket) ends at its deadline, give or take a round, not once the whole
// transfer moved: a round posted all 32 chunks of a 256 MiB write in one
// batch, and the write returned nil 895 ms past its 20 ms deadline
// (test/TestDeadlineEndsLongTransfer, once in CI). A round now posts at
// most postBytes.
func TestDeadlineOfAJobPostedInline(t *testing.T) {
	f := newFakePort()
	f.slowPost = 20 * time.Millisecond // an 8 MiB op at 400 MB/s
	f.setAuto(true, nil)
	l := newLoop(f, 64, DefaultPollPolicy, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	j := NewJob()
	for i := 0; i < 32; i++ {
		j.Chunks = append(j.Chunks, Chunk{Local: uintptr(8<<20*i + 8), Len: 8 << 20, Remote: uint64(8 << 20 * i), Offset: uint64(8 << 20 * i)})
	}
	j.Start = time.Now()
	j.Deadline = j.Start.Add(20 * time.Millisecond)
	require.NoError(t, l.Submit(j))
	require.NoError(t, l.Wait(context.Background(), j))
	took := time.Since(j.Start)
	require.NotEmpty(t, j.Errs, "the job ran to its end, %v past its deadline", took-20*time.Millisecond)
	var te *TimeoutError
	require.ErrorAs(t, j.Errs[0], &te)
	assert.Less(t, te.Completed, 32)
}

// TestOnPostRunsOnceAPostReachedTheProvider: OnPost runs for a job once a
// post of one of its ops reached the provider, a refused one too (1.x
// shm sends its name to a new peer as it refuses the op), and once per
// use of the job; a job none of whose ops reached a post has none.
func TestOnPostRunsOnceAPostReachedTheProvider(t *testing.T) {
	l, f := testLoop(t, 16, false)
	f.accept = 1 // one op per post: FI_EAGAIN for the next
	f.setAuto(true, nil)
	var posts [3]atomic.Int32
	jobs := make([]*Job, 3)
	for i := range jobs {
		jobs[i] = job(1+i, nil)
		jobs[i].OnPost = func(*Job) { posts[i].Add(1) }
		require.NoError(t, l.Submit(jobs[i]))
	}
	step(l) // a batch of all their ops: 0's goes through, 1's first is refused, the rest not offered
	assert.Equal(t, []int32{1, 1, 0}, []int32{posts[0].Load(), posts[1].Load(), posts[2].Load()})
	for i := 0; i < 100 && !jobs[2].finished; i++ {
		step(l)
	}
	require.True(t, isDone(jobs[2]))
	assert.Equal(t, []int32{1, 1, 1}, []int32{posts[0].Load(), posts[1].Load(), posts[2].Load()}, "once per use of a job")
	jobs[0].Reset()
	fillJob(jobs[0], 2, 0)
	require.NoError(t, l.Submit(jobs[0]))
	for i := 0; i < 100 && !jobs[0].finished; i++ {
		step(l)
	}
	require.True(t, isDone(jobs[0]))
	assert.Equal(t, int32(2), posts[0].Load(), "once more in its next use")
}

// TestCloseAfterRunsStoppedOnceNothingPosts: CloseAfter's stopped
// runs once the loop posts nothing more, its progress function drives
// the endpoint, and a stopped that outlasts WedgeAfter within its bound
// does not count as a libfabric call stuck past it (a 1.x shm endpoint's
// close waits up to 500 ms there for its peers; a WedgeAfter of 100 ms
// made that close report a wedged endpoint in a review's reading). One
// that hangs past its bound and WedgeAfter does: Close returns.
func TestCloseAfterRunsStoppedOnceNothingPosts(t *testing.T) {
	const wedge = 20 * time.Millisecond
	start := func(t *testing.T) (*Loop, *fakePort, *Job) {
		f := newFakePort()
		l := newLoop(f, 4, PollPolicy{Spin: time.Millisecond, WedgeAfter: wedge}, zerolog.Nop())
		go l.run()
		j := job(8, nil) // 4 ops in flight, which never complete, and 4 waiting for a slot
		require.NoError(t, l.Submit(j))
		require.Eventually(t, func() bool { return f.inFlight() == 4 }, 10*time.Second, time.Millisecond)
		return l, f, j
	}
	t.Run("within its bound", func(t *testing.T) {
		l, f, j := start(t)
		var postedThen, reapsThen int64
		err := l.CloseAfter(func(progress func() bool) {
			postedThen, reapsThen = f.posted.Load(), f.reaps.Load()
			for start := time.Now(); time.Since(start) < 15*wedge; { // past AwaitStop's looks every 100 ms
				progress()
				time.Sleep(time.Millisecond) // a wait for peers, as long as it takes
			}
			assert.Greater(t, f.reaps.Load(), reapsThen+2, "progress reaps")
		}, time.Second, nil)
		require.NoError(t, err, "not wedged")
		assert.Equal(t, postedThen, f.posted.Load(), "nothing posted during or after stopped")
		assert.Equal(t, int64(4), postedThen)
		require.True(t, isDone(j))
		assert.ErrorIs(t, errors.Join(j.Errs...), ErrClosed)
	})
	t.Run("hung past it", func(t *testing.T) {
		l, _, _ := start(t)
		release := make(chan struct{})
		defer close(release)
		closed := make(chan error, 1)
		go func() { closed <- l.CloseAfter(func(func() bool) { <-release }, 10*time.Millisecond, nil) }()
		select {
		case err := <-closed:
			var we *WedgedError
			require.ErrorAs(t, err, &we)
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return with stopped hung past its bound and WedgeAfter")
		}
	})
}

// TestNilContextIsBackground: a nil context, to Wait, Await, DoBy and
// DoAfterRoundBy, waits as context.Background does; it does not panic,
// and Wait does not report a job that is still in the loop as ended.
func TestNilContextIsBackground(t *testing.T) {
	var nilCtx context.Context
	l, f := testLoop(t, 4, false)
	f.auto = true
	go l.run()
	t.Cleanup(func() { l.Close(nil) })
	for _, wait := range []func(context.Context, *Job) error{l.Wait, l.Await} {
		j := job(1, nil)
		j.Start, j.Deadline = time.Now(), time.Now().Add(10*time.Second)
		require.NoError(t, l.Submit(j))
		require.NoError(t, wait(nilCtx, j))
		require.Empty(t, j.Errs)
	}
	ran := 0
	require.NoError(t, l.DoBy(nilCtx, time.Now().Add(10*time.Second), func() { ran++ }))
	require.NoError(t, l.DoAfterRoundBy(nilCtx, time.Now().Add(10*time.Second), func() { ran++ }))
	require.Equal(t, 2, ran)
}
