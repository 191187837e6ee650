package progress

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/endpoint"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
)

// postBatch is how many ops one cgo call posts at most.
const postBatch = 64

// Chunk is one RMA op of a job: a contiguous piece of the transfer.
type Chunk struct {
	Local  uintptr     // local memory address (registered: off the Go heap, or device memory)
	Desc   fabric.Desc // its fi_mr_desc
	Len    uint64
	Remote uint64 // remote address (virtual address or offset)
	Key    uint64 // remote key
	Offset uint64 // of the chunk within the transfer, for errors
}

// Job is one transfer: chunks of one op to one peer. Fill the exported
// fields, Submit, then Wait; results are valid after Wait. A Job may be
// reused (Reset) once Wait returned and OnIdle ran.
type Job struct {
	Op       Op
	Peer     uint64 // fi_addr_t
	PeerName string // printable peer address, for errors
	Flags    uint64 // op flags besides FI_COMPLETION (FI_DELIVERY_COMPLETE)
	Chunks   []Chunk
	Start    time.Time
	// Deadline, when not zero, finishes the job with a *TimeoutError
	// (wrapping context.DeadlineExceeded) if it is not done by then. Past
	// it the loop posts no more of a job of several chunks, and finishes
	// it before it reaps again: only the call under way at the deadline,
	// or one begun less than deadlineGrain after it (the loop looks at
	// most that often), may still complete it and make it a success.
	Deadline time.Time
	// Tag is the submitter's; the loop does not touch it.
	Tag any
	// Check, when set, is called while the job runs, at most every
	// CheckEvery: a non-nil error (the peer is gone, say) finishes the job
	// with it at once instead of at its deadline.
	Check func(*Job) error
	// OnIdle runs on the loop goroutine once the job is finished and no
	// chunk of it is in flight any more — possibly after Wait returned,
	// when a timed-out chunk completes late. Local memory of the job must
	// stay mapped until then.
	OnIdle func(*Job)
	// OnPost, when set, runs where the job's ops are posted, under the
	// loop's drive lock on whichever goroutine drives, once per use of
	// the job: when a post of one of its ops first reached the provider,
	// even one it refused (FI_EAGAIN) or failed. A provider may tell the
	// peer of this endpoint then, before any op goes through (1.x shm
	// sends its name). It must not call the loop (Do would wait for
	// itself).
	OnPost func(*Job)
	// OnStrand, when set, runs on the loop goroutine once, when the job
	// finishes (an error, its deadline or context, a failed Check) with
	// ops of it still in flight: ops a provider may never complete, and
	// that then hold back what the endpoint completes after them.
	OnStrand func(*Job)

	// Errs holds one error per failed chunk, a *TimeoutError when the
	// context ended first, or ErrClosed.
	Errs []error
	// Completed counts chunks that completed successfully.
	Completed int
	// Attempted counts chunks that were posted (or failed to post).
	Attempted int

	done chan struct{}
	gen  atomic.Uint64
	// busy is set from Submit until the job settles (finished, nothing in
	// flight): a job is in at most one loop queue at a time.
	busy atomic.Bool
	// left: its waiter gave up on it while a call held the endpoint
	// (TimeoutError.Left), for this cause; the loop's next round
	// expires it before posting any more of it.
	left atomic.Pointer[error]

	// under the loop's drive lock
	running        int   // index in Loop.running, -1 when not there
	checked        int64 // monoNow of the last Check (or of intake)
	next, inflight int
	inflightBytes  uint64 // the bytes of the chunks in flight (jobInflight)
	multi          bool   // of more than one chunk, counted in Loop.multi
	finished       bool
	stopPosting    bool
	idled          bool
	reached        bool // a post of one of its ops reached the provider (OnPost)
}

// NewJob returns an empty job.
func NewJob() *Job { return &Job{done: make(chan struct{}, 1)} }

// Reset clears a finished, idle job for reuse, keeping its slices'
// capacity. The new generation makes any record of the old one stale.
func (j *Job) Reset() {
	j.gen.Add(1)
	select {
	case <-j.done: // a finish nobody waited for must not end the next use
	default:
	}
	j.Op, j.Peer, j.PeerName, j.Flags = 0, 0, "", 0
	j.Start, j.Deadline, j.Check, j.checked = time.Time{}, time.Time{}, nil, 0
	j.Chunks = j.Chunks[:0]
	j.Errs = j.Errs[:0]
	j.Completed, j.Attempted = 0, 0
	j.next, j.inflight, j.inflightBytes, j.multi = 0, 0, 0, false
	j.finished, j.stopPosting, j.idled, j.reached = false, false, false, false
	j.left.Store(nil) // consumed when it finished: nothing to count
}

// InFlight is how many chunks of the job are posted and not completed.
// It may be read only where the loop calls back: in Check and OnIdle.
func (j *Job) InFlight() int { return j.inflight }

// Bytes is the sum of the chunk lengths.
func (j *Job) Bytes() uint64 {
	var n uint64
	for i := range j.Chunks {
		n += j.Chunks[i].Len
	}
	return n
}

// slotRec is what an op context stands for: a chunk of one generation
// of a job. A completion finishes that chunk only while the job is still
// in that generation.
type slotRec struct {
	job   *Job
	gen   uint64
	chunk int32
}

// posting is an op of the batch being posted and its slot.
type posting struct {
	rec  slotRec
	slot uint32
}

// Loop drives the progress of one endpoint. Every libfabric call on the
// endpoint, and all of the loop's bookkeeping, happen under its drive lock,
// taken by whoever progresses the endpoint: a goroutine waiting for its own
// job (it posts and reaps itself, with no hand-off to another goroutine),
// or, when nobody waits, the loop's background goroutine — which keeps
// progressing even when the endpoint is only a target (parked, when idle,
// where that keeps no peer waiting: see PollPolicy). On a passive loop
// (an endpoint whose calls may never return: shm) only the background
// goroutine posts and progresses; waiters and pollers hand off to it and
// keep their deadlines. Do and DoBy run their function on the caller's
// goroutine on every loop.
type Loop struct {
	ep     *endpoint.Endpoint // nil for a loop over a test port
	port   port
	policy PollPolicy
	// passive: callers never call libfabric themselves (Wait, Poll): a
	// call may never return on this endpoint (port.callsMayNeverReturn).
	passive    bool
	counted    bool // the endpoint counts peers' RMA ops (port.hasRemoteOps)
	log        zerolog.Logger
	wedgeAfter time.Duration

	mu    sync.Mutex // guards the fields up to drive
	inbox []*Job
	// queued: jobs are in the inbox (set under mu by Submit), so that a
	// round with nothing submitted takes no lock.
	queued atomic.Bool
	// closing: Close was called. Set under mu (Submit checks it there);
	// the background goroutine loads it each round without the lock.
	closing     atomic.Bool
	beforeClose func()
	// stoppedPosting: CloseAfter's stopped, run by the shutdown, and
	// its bound.
	stoppedPosting func(progress func() bool)
	stoppedBound   time.Duration

	drive   sync.Mutex    // held for every endpoint call and the state below
	drivers atomic.Int32  // goroutines driving progress in Wait
	polled  atomic.Int64  // when Poll was last called (monoNow)
	rounds  atomic.Uint64 // iterations so far, to within 16 (Rounds)
	ran     atomic.Uint64 // rounds the loop's goroutine finished (awaitRounds)
	polls   atomic.Uint64 // Poll calls so far (Polls)
	// deferSettle: shutdown's drain settles nothing (settle); under the
	// drive lock.
	deferSettle bool
	// posted and completed count ops (Activity): a caller watching for a
	// link that stopped moving reads them from another goroutine.
	posted, completed atomic.Uint64
	// pollers and roundDone: a passive loop's Poll waits for the loop's
	// next round instead of spinning beside it (see Poll).
	pollers   atomic.Int32
	roundDone chan struct{}
	// waiters: goroutines in a passive loop's Wait. handing: the loop's
	// goroutine waits for their kick (handOff).
	waiters atomic.Int32
	handing atomic.Bool
	// activeAt is lastActive for other goroutines (PollIfWanted);
	// idlePolled: when PollIfWanted last polled an idle loop.
	activeAt, idlePolled atomic.Int64
	// yieldedAt: when a goroutine driving or polling the endpoint last
	// yielded its thread (yieldShared).
	yieldedAt atomic.Int64
	timers    sync.Pool    // *time.Timer for Poll's bound
	inCall    atomic.Int64 // when the running progress call started (monoNow), 0 when none
	leftJobs  atomic.Int32 // jobs whose Job.left is set
	sleeping  atomic.Bool  // the background goroutine is in block (fi_trywait, then the CQ's fd without the drive lock)
	// parked: the background goroutine waits for work without polling
	// (park), so a Submit must wake it.
	parked atomic.Bool
	// attendOnly: peers that need this endpoint's progress hold an Attend
	// (ParkWhenUnattended); attending counts them.
	attendOnly atomic.Bool
	attending  atomic.Int32
	// noPeers: no peer's op ever needs this endpoint's progress
	// (ServesNoPeers).
	noPeers atomic.Bool
	// peerWake: a peer's op is on its way (Wake); the next round counts
	// as activity.
	peerWake atomic.Bool
	parkFor  time.Duration // parkFor, or what a test set
	wake     chan struct{}
	exited   chan struct{}
	timer    *time.Timer // the background goroutine's

	// under drive
	down       bool   // the endpoint is closed
	spareJobs  []*Job //
	active     []*Job // jobs with chunks not yet posted, in order
	running    []*Job // jobs not finished, for deadlines
	slots      []slotRec
	free       []uint32
	batch      []posting
	inflight   int
	iter       int
	lastActive int64  // monoNow of the last activity
	deadlineAt int64  // monoNow of the last deadline check
	multi      int    // running jobs of more than one chunk
	postMax    int    // ops the next post tries at most: see post
	stale      int    // completions whose op context was not live (logged, dropped)
	woke       bool   // a job finished in this round of iterate (run yields then)
	remoteSeen uint64 // port.remoteOps at the last look (peersActive)
	// remoteLooked: monoNow of that look
	remoteLooked int64
	// waitLogged: monoNow of the last failed wait logged (waitFailed).
	waitLogged int64

	cpuYields atomic.Uint64 // yieldCPU's yields, for tests
	goYields  atomic.Uint64 // yieldIfDue's and yieldShared's yields, for tests
}

// monoBase is the origin of monoNow.
var monoBase = time.Now()

// monoNow is a monotonic clock in nanoseconds, offset by an hour so that a
// zero timestamp reads as long ago. It reads only the monotonic clock
// (time.Now reads the wall clock too, twice the cost), and the busy loops
// below read it once per round: clock reads were a third of a busy
// owner's polling time.
func monoNow() int64 { return int64(time.Since(monoBase)) + int64(time.Hour) }

// Start starts the progress loop of ep. The loop owns ep from now on:
// Close closes it.
func Start(ep *endpoint.Endpoint, policy PollPolicy, log zerolog.Logger) *Loop {
	l := newLoop(newEndpointPort(ep), ep.Depth(), policy, log)
	l.ep = ep
	go l.run()
	return l
}

// newLoop sets up a loop over p with depth op contexts; run starts it.
func newLoop(p port, depth int, policy PollPolicy, log zerolog.Logger) *Loop {
	l := &Loop{
		port: p, policy: policy.normalized(), log: log.With().Str("provider", p.provider()).Logger(),
		wedgeAfter: policy.normalized().WedgeAfter, passive: p.callsMayNeverReturn(), counted: p.hasRemoteOps(), roundDone: make(chan struct{}, 1),
		wake: make(chan struct{}, 1), exited: make(chan struct{}),
		slots: make([]slotRec, depth), free: make([]uint32, depth),
		batch: make([]posting, 0, postBatch), lastActive: monoNow(), postMax: postBatch,
		timer: time.NewTimer(time.Hour), parkFor: parkFor,
	}
	l.timer.Stop()
	for i := range l.free {
		l.free[i] = uint32(depth - 1 - i)
	}
	return l
}

// Endpoint is the loop's endpoint. Call its methods only inside Do.
func (l *Loop) Endpoint() *endpoint.Endpoint { return l.ep }

// Submit queues a job; Wait for it, which progresses it. (Submit does not
// wake a polling background goroutine: it would only compete with the
// waiter. Without a waiter the job still starts within the poll policy's
// MaxSleep, or within max(MaxSleep, 1ms) of the last waiter leaving; a
// parked goroutine is woken.) It
// fails with ErrClosed when the loop is closing, and with ErrJobBusy when
// the job is still in a loop (submitted and not yet settled).
func (l *Loop) Submit(j *Job) error {
	if !j.busy.CompareAndSwap(false, true) {
		return ErrJobBusy
	}
	l.mu.Lock()
	if l.closing.Load() {
		l.mu.Unlock()
		j.busy.Store(false)
		return ErrClosed
	}
	l.inbox = append(l.inbox, j)
	l.queued.Store(true)
	l.mu.Unlock()
	if l.parked.Load() {
		// A parked loop would not look for a job nobody waits for until
		// parkFor passed. (After the inbox: see idle.)
		l.kick()
	}
	return nil
}

// ErrJobBusy is a Submit of a job that a loop still holds.
var ErrJobBusy = errors.New("job submitted again before it settled")

// Wait waits until the job finished, progressing the endpoint itself while
// that brings completions (for up to the poll policy's Spin without any),
// then leaving it to the background goroutine — on a passive loop, from
// the start: it kicks the goroutine and watches for its job, then parks.
// When ctx ends first, the job is finished with a *TimeoutError; chunks
// still in flight stay registered until they complete. It returns nil
// with the job finished; a *TimeoutError with Left set when the job's end
// came while a call held the endpoint or the loop was closing; or a
// *WedgedError when the endpoint is stuck inside libfabric. A left job
// stays the loop's, which ends it before posting any more of it, and
// must not be reused. A nil ctx is context.Background (so in Await, DoBy
// and DoAfterRoundBy).
func (l *Loop) Wait(ctx context.Context, j *Job) error {
	ctx = orBackground(ctx)
	select {
	case <-j.done:
		return nil
	default:
	}
	if l.passive {
		l.waiters.Add(1)
		l.polled.Store(monoNow())
		defer func() {
			l.polled.Store(monoNow())
			l.waiters.Add(-1)
		}()
		handing := l.handing.Load()
		l.kick()
		// Watch for the job a moment before parking when the loop's
		// goroutine runs on another thread: it often finishes a small op
		// within microseconds, and waking a parked goroutine from another
		// thread costs more than that. Yield now and then: when the
		// loop's goroutine waits for this P (the other thread busy, or
		// descheduled on a loaded machine), it runs at once instead of
		// after the watch. A loop waiting for the kick (handOff) runs on
		// this thread as soon as this goroutine parks: no watch then.
		for start, i := monoNow(), 0; !handing; i++ {
			select {
			case <-j.done:
				return nil
			default:
			}
			if i&63 == 63 {
				if monoNow()-start > int64(passiveSpin) {
					break
				}
				runtime.Gosched()
			}
		}
		return l.waitPassive(ctx, j)
	}
	l.drivers.Add(1)
	now := monoNow()
	last := now
	for i := 1; ; i++ {
		// A background goroutine blocked on the CQ's fd holds no lock
		// (block): no need to wake it first.
		worked, drove := false, false
		if l.drive.TryLock() {
			worked, drove = l.iterate(now), true
			l.drive.Unlock()
		}
		select {
		case <-j.done: // before the clock read below, which a finished job does not need
			l.drivers.Add(-1)
			l.wakeIfSleeping()
			// Most Waits of a stream of small ops end here, within 64
			// looks: the yield must be checked here too.
			l.yieldShared(now)
			return nil
		default:
		}
		// The next round's clock: read after a round that did something
		// (it may have taken long), else every 8th. Rounds that find
		// nothing take a fraction of a microsecond, and a clock read
		// was a fifth of one in a pingpong; iterate needs its clock only
		// to tens of microseconds (deadlineGrain). A clock seven such
		// rounds old would move a wedge (WedgeAfter, seconds) early only
		// if each had sat in libfabric for a good part of a second.
		if worked || i&7 == 0 {
			now = monoNow()
		}
		if worked {
			last = now // after the round: a long one that worked is not quiet
		}
		// Every 64 looks, not 1024: a round may take milliseconds (tcp
		// moving megabytes), and a cancelled waiter must not sit out
		// a thousand of them.
		if i&63 == 0 {
			// Past the job's deadline too, when the lock was another's
			// (stuck in a call, maybe): a round of this waiter's own
			// expires the job itself, with no wall clock read here.
			// A wedge too, when the lock was another's: a waiter with no
			// deadline under a policy that spins for ever would
			// otherwise spin behind a call that never returns.
			if ctx.Err() != nil || now-last > int64(l.policy.Spin) || !drove && (pastDeadline(j) || l.Wedged() != nil) {
				break
			}
			l.yieldShared(now)
			// Quiet by the endpoint's last activity, not only this
			// waiter's rounds: another driver may be completing ops.
			if now-max(last, l.activeAt.Load()) > int64(quietAfter) {
				l.yieldCPU()
			}
		}
	}
	l.drivers.Add(-1)
	l.kick()
	return l.waitPassive(ctx, j)
}

// Await waits for the job as Wait does, but never progresses the
// endpoint itself: the loop's goroutine (or another driver) does. For a
// caller that must come back even when a libfabric call on the endpoint
// never returns (a check of an endpoint a dead peer may have left
// spinning on a lock): such a call of another goroutine's wedges the
// endpoint, and Await returns a *WedgedError, or a *TimeoutError with
// Left set at the job's deadline when the call has not run WedgeAfter by
// then; a Wait whose own call never returns never returns either.
func (l *Loop) Await(ctx context.Context, j *Job) error {
	ctx = orBackground(ctx)
	select {
	case <-j.done:
		return nil
	default:
	}
	l.kick()
	return l.waitPassive(ctx, j)
}

// waitPassive leaves progress to the background goroutine and waits for
// the job, ctx, the job's deadline, or a wedged endpoint.
func (l *Loop) waitPassive(ctx context.Context, j *Job) error {
	// A pooled timer, not a ticker: this runs once per op on a passive
	// loop, and a new ticker is three allocations.
	t, _ := l.timers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(l.nextLook(j))
	} else {
		t.Reset(l.nextLook(j))
	}
	defer func() { t.Stop(); l.timers.Put(t) }()
	var cause error
	for cause == nil {
		select {
		case <-j.done:
			return nil
		case <-ctx.Done():
			cause = ctx.Err()
		case <-t.C:
			if err := l.Wedged(); err != nil {
				// Should the call return after all, the loop expires the
				// job before posting any more of it: its caller has its
				// answer, and may no longer expect its memory to be used.
				l.leave(j, j.gen.Load(), err)
				return err
			}
			if pastDeadline(j) {
				// The loop expires the job at its deadline, unless a call
				// that has not returned holds it: then this waiter does.
				cause = context.DeadlineExceeded
				break
			}
			t.Reset(l.nextLook(j))
		}
	}
	gen := j.gen.Load()
	if err := l.acquireToAbort(j); err != nil {
		if errors.Is(err, errFinished) {
			return nil
		}
		if errors.Is(err, errBusy) {
			select {
			case <-j.done: // it finished meanwhile
				return nil
			default:
			}
			// A call that has not returned holds the endpoint, yet it is
			// not wedged: the job is left to the loop, which expires it
			// in its next round, before posting any more of it. The
			// caller must not reuse the job, only drop its hold on it.
			l.leave(j, gen, cause)
			// Only what the loop does not write: the job is its.
			return &TimeoutError{Op: j.Op, Provider: l.port.provider(), Peer: j.PeerName, Bytes: j.Bytes(),
				After: time.Since(j.Start), Total: len(j.Chunks), Cause: cause, Left: true, Closing: l.closing.Load()}
		}
		l.leave(j, gen, err) // wedged: as above
		return err
	}
	l.abort(j, gen, cause)
	l.drive.Unlock()
	<-j.done
	return nil
}

// nextLook is how long a parked waiter sleeps before it looks for a
// wedge, or for the job's deadline when that comes first.
func (l *Loop) nextLook(j *Job) time.Duration {
	if !j.Deadline.IsZero() {
		if d := time.Until(j.Deadline); d < wedgeCheck {
			return max(d, 0) + time.Microsecond // just past it
		}
	}
	return wedgeCheck
}

// orBackground is ctx, or context.Background for a nil one: a waiter's
// job is in the loop by then, and an error instead of the wait would
// tell its caller that it ended.
func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// pastDeadline reports whether j has a deadline and it passed.
func pastDeadline(j *Job) bool {
	return !j.Deadline.IsZero() && !time.Now().Before(j.Deadline)
}

// leave marks generation gen of j as left by its waiter for cause; the
// loop expires it (expireLeft).
func (l *Loop) leave(j *Job, gen uint64, cause error) {
	if j.gen.Load() != gen {
		return
	}
	j.left.Store(&cause)
	l.leftJobs.Add(1)
}

// takeLeft clears j's left mark; it returns its cause, nil when it had
// none. Under the drive lock.
func (l *Loop) takeLeft(j *Job) error {
	if j.left.Load() == nil {
		return nil
	}
	if c := j.left.Swap(nil); c != nil {
		l.leftJobs.Add(-1)
		return *c
	}
	return nil
}

// expireLeft expires the running jobs their waiters left (leave), before
// the round posts more of them. A mark set on a job that had finished
// meanwhile is never taken: when the scan finds no mark, the count is
// reset, unless a waiter left a job since the scan began. Under the drive
// lock.
func (l *Loop) expireLeft() {
	seen := l.leftJobs.Load()
	found := false
	for i := 0; i < len(l.running); {
		j := l.running[i]
		if c := j.left.Load(); c != nil {
			found = true
			l.expire(j, *c) // removes j from running, and its mark (finish)
			continue
		}
		i++
	}
	if !found && !l.leftInInbox() {
		l.leftJobs.CompareAndSwap(seen, 0)
	}
}

// leftInInbox reports whether a job still in the inbox was left: its
// waiter left it after this round's intake; the next round expires it.
func (l *Loop) leftInInbox() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, j := range l.inbox {
		if j.left.Load() != nil {
			return true
		}
	}
	return false
}

// passiveSpin is how long a waiter on a passive loop watches for its job
// before it parks.
const passiveSpin = 50 * time.Microsecond

// wedgeCheck is how often a waiter checks whether the endpoint wedged.
const wedgeCheck = 100 * time.Millisecond

// abortWait is how long a waiter whose context or deadline ended waits
// for the drive lock of a passive loop before it leaves its job to the
// loop. On other loops it waits for the call that holds the lock unless
// that call has run for stuckCall.
const abortWait = 50 * time.Millisecond

// errBusy: the drive lock stayed taken by a call that is not (yet) wedged.
var errBusy = errors.New("endpoint busy in a libfabric call")

// errFinished: the job finished while its waiter waited for the drive
// lock to abort it (Close's shutdown fails every job as it begins).
var errFinished = errors.New("job finished")

// stuckCall is how long the call holding a loop that is not passive may
// have run before a waiter whose request ended leaves its job to the
// loop. Rounds take microseconds, or milliseconds moving megabytes; a
// waiter that left a job whose call was merely slow would return while
// the job could still complete.
const stuckCall = time.Second

// acquireToAbort takes the drive lock for a waiter whose request ended,
// giving up with errBusy when a call holds it too long (abortWait on a
// passive loop, whose calls may never return; stuckCall elsewhere) or
// the loop is closing, or with errFinished, having taken j's done
// signal, when j finished meanwhile (Close's shutdown fails a job with
// nothing in flight as it begins).
func (l *Loop) acquireToAbort(j *Job) error {
	if l.passive {
		return l.acquireWithin(abortWait)
	}
	l.drivers.Add(1)
	defer l.drivers.Add(-1)
	for !l.drive.TryLock() {
		if err := l.Wedged(); err != nil {
			return err
		}
		if at := l.inCall.Load(); at != 0 && time.Duration(monoNow()-at) > stuckCall {
			return errBusy
		}
		select {
		case <-j.done:
			return errFinished
		default:
		}
		if l.closing.Load() {
			// Close's shutdown holds the lock, or will: it ends a job
			// with chunks in flight only once they can move no more,
			// after its drain (up to shutdownDrain) and the endpoint's
			// close. The waiter leaves the job to it instead of waiting.
			return errBusy
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// acquireWithin is acquire, giving up with errBusy after d.
func (l *Loop) acquireWithin(d time.Duration) error {
	return l.acquireBy(context.Background(), time.Now().Add(d))
}

// acquireBy is acquire, giving up with errBusy when ctx ends or at
// deadline (none when zero).
func (l *Loop) acquireBy(ctx context.Context, deadline time.Time) error {
	l.drivers.Add(1)
	defer l.drivers.Add(-1)
	for !l.drive.TryLock() {
		if err := l.Wedged(); err != nil {
			return err
		}
		if ctx.Err() != nil || !deadline.IsZero() && !time.Now().Before(deadline) {
			return errBusy
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// abort finishes generation gen of j with a *TimeoutError for cause,
// unless it finished already. Under the drive lock.
func (l *Loop) abort(j *Job, gen uint64, cause error) {
	if l.down || j.gen.Load() != gen || j.finished {
		return
	}
	// The job may still be in the inbox: take it in first, so that it is
	// in no queue once finished. Left in the inbox, it would come back
	// after its submitter reused it and finish the next transfer early.
	l.intake(monoNow())
	l.expire(j, cause)
}

// acquire takes the drive lock from outside the loop: it makes the
// background goroutine stand back (it pauses while drivers > 0) so that
// it cannot starve the caller, and gives up with a *WedgedError when the
// holder is stuck inside libfabric.
func (l *Loop) acquire() error {
	l.drivers.Add(1)
	defer l.drivers.Add(-1)
	for !l.drive.TryLock() {
		if err := l.Wedged(); err != nil {
			return err
		}
		time.Sleep(20 * time.Microsecond)
	}
	return nil
}

// WedgeAfter is how long a libfabric call may run before the loop counts
// its endpoint as wedged.
const WedgeAfter = 10 * time.Second

// WedgedError is an endpoint stuck inside a libfabric call: no progress
// can be made on it any more.
type WedgedError struct {
	Provider string
	Since    time.Duration
}

func (e *WedgedError) Error() string {
	return fmt.Sprintf("the %s endpoint is stuck inside libfabric (a progress call has not returned for %v)%s",
		e.Provider, e.Since.Round(time.Second), wedgeCause(e.Provider))
}

// Is makes errors.Is(err, transport.ErrEndpointWedged) true.
func (e *WedgedError) Is(target error) bool { return target == errclass.ErrWedged }

// wedgeCause is the cause and the way out of a wedge of provider's: a
// transport.Manager replaces a stuck shm endpoint by itself.
func wedgeCause(provider string) string {
	if provider == "shm" {
		return ": libfabric's shm spins forever on a region lock that a peer process held when it died; " +
			"the next requests go out on a new shm endpoint, and the thread stuck in this one spins until the process exits"
	}
	return "; close the manager and open a new one"
}

// Wedged returns a *WedgedError when a libfabric call on the endpoint has
// been running for longer than WedgeAfter.
func (l *Loop) Wedged() error {
	start := l.inCall.Load()
	if start == 0 {
		return nil
	}
	if d := time.Duration(monoNow() - start); d > l.wedgeAfter {
		return &WedgedError{Provider: l.port.provider(), Since: d}
	}
	return nil
}

// CallStart is when the libfabric call under way on the endpoint began
// (an opaque stamp; 0 when none is): a caller that saw one compares it
// later to tell whether that call returned.
func (l *Loop) CallStart() int64 { return l.inCall.Load() }

// WedgeAfter is how long a libfabric call on the endpoint may run before
// Wedged reports it.
func (l *Loop) WedgeAfter() time.Duration { return l.wedgeAfter }

// Activity counts the ops posted and completed so far: while more were
// posted than completed, a completion count that does not move says the
// link does not.
func (l *Loop) Activity() (posted, completed uint64) { return l.posted.Load(), l.completed.Load() }

// Rounds is how many rounds of progress (post, reap) the endpoint has
// had, to within 16: a clock that runs only as fast as the loop gets the
// CPU, for grace periods that must not run out on a loaded machine.
func (l *Loop) Rounds() uint64 { return l.rounds.Load() }

// Polls is how many times Poll (or PollIfWanted) polled the endpoint, or
// tried to while another goroutine held it.
func (l *Loop) Polls() uint64 { return l.polls.Load() }

// InFlight is how many ops are posted and not completed; only inside Do.
func (l *Loop) InFlight() int { return l.inflight }

// Poll progresses the endpoint once, unless another goroutine is doing so
// right now, and reports whether anything happened. For callers that spin
// on memory themselves (a pingpong watching for a peer's write) and so
// are the natural driver of progress. On a passive loop it kicks the
// loop's goroutine instead and blocks until its next round, for up to a
// millisecond, and reports whether a round ran.
func (l *Loop) Poll() bool { return l.pollAt(monoNow()) }

// pollAt is Poll at now (monoNow).
func (l *Loop) pollAt(now int64) bool {
	l.polls.Add(1)
	if l.passive {
		return l.pollPassive()
	}
	l.polled.Store(now)
	l.yieldShared(now)
	if !l.drive.TryLock() {
		return false
	}
	worked := l.lookForPeers(now, l.iterate(now))
	l.drive.Unlock()
	l.wakeIfSleeping()
	return worked
}

// PollIfWanted is Poll for a caller spinning on memory (transport's
// Manager.Poll and PollRoute), when it should poll this endpoint now:
// always while ops are in flight or within a millisecond of activity,
// else at most every idlePollEvery — on an endpoint that counts peers'
// ops (shm), where a peer's first op toward an idle endpoint still meets
// a poll within idlePollEvery and makes it active. A round of an idle shm
// endpoint is a hand-off to the loop's goroutine (passive), microseconds at
// every look of a spinning caller. Endpoints without that count (tcp) are
// polled at every call: a spinning target's polls are what lands a peer's
// writes there without a wake-up. It reads the clock once: at a spinning
// caller's every look, a second read cost as much as the rest of an idle
// look.
func (l *Loop) PollIfWanted() bool {
	now := monoNow()
	if l.counted && l.posted.Load() == l.completed.Load() && now-l.activeAt.Load() >= int64(time.Millisecond) {
		last := l.idlePolled.Load()
		if now-last < int64(idlePollEvery) || !l.idlePolled.CompareAndSwap(last, now) {
			return false
		}
	}
	return l.pollAt(now)
}

// idlePollEvery is how often PollIfWanted polls an idle loop.
const idlePollEvery = 100 * time.Microsecond

// pollPassive is Poll on a passive loop: it cannot call libfabric, so it
// wakes the loop and waits for its next round, for at most a millisecond
// (the loop may be inside a call that never returns). Blocking, not
// spinning, leaves the CPU to the loop's goroutine: a caller spinning on
// memory beside a spinning loop halves what each gets on a small machine.
func (l *Loop) pollPassive() bool {
	l.polled.Store(monoNow())
	l.pollers.Add(1)
	defer l.pollers.Add(-1)
	l.kick()
	t, _ := l.timers.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(pollBound)
	} else {
		t.Reset(pollBound)
	}
	worked := false
	select {
	case <-l.roundDone:
		worked = true
	case <-t.C:
	}
	t.Stop()
	l.timers.Put(t)
	return worked
}

// pollBound is the longest a passive Poll waits for the loop's round.
const pollBound = time.Millisecond

// Do runs fn with the endpoint to itself: the way to register memory,
// insert peers or close MRs. It fails with ErrClosed once the endpoint is
// closed.
func (l *Loop) Do(fn func()) error {
	if err := l.acquire(); err != nil {
		return err
	}
	return l.do(fn)
}

// DoBy is Do for a request: when a libfabric call holds the endpoint
// past the request's end (ctx, or deadline when not zero), it gives up
// with a *TimeoutError whose Busy is set, and fn does not run. The holder
// may be the loop's goroutine in a call that has not returned yet is not
// wedged (shm's, blocked behind a stopped peer).
func (l *Loop) DoBy(ctx context.Context, deadline time.Time, fn func()) error {
	ctx = orBackground(ctx)
	start := time.Now()
	if err := l.acquireBy(ctx, deadline); err != nil {
		if !errors.Is(err, errBusy) {
			return err
		}
		cause := ctx.Err()
		if cause == nil {
			cause = context.DeadlineExceeded
		}
		return &TimeoutError{Provider: l.port.provider(), After: time.Since(start), Cause: cause, Busy: true}
	}
	return l.do(fn)
}

// DoAfterRoundBy is DoBy after three rounds of progress: fn then finds
// processed what peers had queued on the endpoint when it began (before
// shm forgets a peer that left, the commands it queued; a round stops
// early when the provider says to try again). On a loop that is not
// passive they run under the same hold of the endpoint as fn; on a
// passive one the loop's goroutine runs them first (awaitRounds), as its
// callers never call libfabric to progress it, and a request that ends
// before they ran returns ctx's error or context.DeadlineExceeded,
// wrapped, without running fn. Either way the caller must know that
// nothing new is queued meanwhile for what fn does.
func (l *Loop) DoAfterRoundBy(ctx context.Context, deadline time.Time, fn func()) error {
	ctx = orBackground(ctx)
	if l.passive {
		if err := l.awaitRounds(ctx, deadline, 3); err != nil {
			return err
		}
	}
	return l.DoBy(ctx, deadline, func() {
		for i := 0; i < 3 && !l.passive; i++ {
			l.iterate(monoNow())
		}
		fn()
	})
}

// awaitRounds waits until the loop's goroutine ran n whole rounds from
// now (a round under way at the call does not count), kicking it and
// looking every awaitLook, or returns what ends the wait first: ctx's
// error or context.DeadlineExceeded past deadline (when not zero),
// wrapped in one that says the rounds had not run, a *WedgedError, or
// ErrClosed.
func (l *Loop) awaitRounds(ctx context.Context, deadline time.Time, n uint64) error {
	start := time.Now()
	want := l.ran.Load() + n + 1
	t := time.NewTimer(awaitLook)
	defer t.Stop()
	for l.ran.Load() < want {
		var cause error
		switch {
		case ctx.Err() != nil:
			cause = ctx.Err()
		case !deadline.IsZero() && !time.Now().Before(deadline):
			cause = context.DeadlineExceeded
		case l.closing.Load():
			return ErrClosed
		}
		if cause != nil {
			return fmt.Errorf("the %s endpoint's progress goroutine had not run %d rounds after %v: %w",
				l.port.provider(), n, time.Since(start).Round(time.Millisecond), cause)
		}
		if err := l.Wedged(); err != nil {
			return err
		}
		l.kick()
		t.Reset(awaitLook)
		<-t.C
	}
	return nil
}

// awaitLook is how often awaitRounds looks at the loop's rounds: it
// waits on no signal of the loop's, which Polls share.
const awaitLook = 50 * time.Microsecond

// do runs fn under the drive lock, which it releases.
func (l *Loop) do(fn func()) error {
	defer l.wakeIfSleeping()
	defer l.drive.Unlock()
	if l.down {
		return ErrClosed
	}
	// fn calls libfabric (fi_av_insert, fi_av_remove): a call that never
	// returns wedges the endpoint as a stuck progress call does.
	l.inCall.Store(monoNow())
	defer l.inCall.Store(0)
	fn()
	return nil
}

// Close fails the jobs not yet finished with ErrClosed, runs
// beforeEndpointClose (if not nil) with the endpoint to itself — the place
// to close memory registrations, which must go before their endpoint —
// then closes the endpoint and stops the loop. A job with ops in flight
// fails only once they can move no more: when they completed in the drain
// (endpoints unsafe to close with ops in flight), or after the endpoint's
// close. Closing twice is a no-op.
// When a libfabric call on the endpoint has not returned for the policy's
// WedgeAfter, it returns that *WedgedError instead of waiting forever: the
// endpoint and what it uses are then left to the goroutine stuck in it.
func (l *Loop) Close(beforeEndpointClose func()) error {
	return l.CloseAfter(nil, 0, beforeEndpointClose)
}

// CloseAfter is Close, which first runs stopped, when not nil, on the
// loop's goroutine once the loop failed its jobs and posts nothing more,
// before beforeEndpointClose: a wait for peers (a 1.x shm endpoint waits
// for them to map its region), which should end within bound. Only once
// it ran past bound does it count toward WedgeAfter, as a libfabric call
// that does not return would; each call of the progress function it gets
// is timed as one from its start, as the drain's reads are. That function
// reaps completions and drives the provider's progress, for peers' ops
// that need it, and reports whether it found any.
func (l *Loop) CloseAfter(stopped func(progress func() bool), bound time.Duration, beforeEndpointClose func()) error {
	l.mu.Lock()
	l.beforeClose = beforeEndpointClose // before closing: run may see it at once
	if stopped != nil {
		l.stoppedPosting, l.stoppedBound = stopped, bound
	}
	already := l.closing.Swap(true)
	l.mu.Unlock()
	if !already {
		l.kick()
	}
	if err := l.AwaitStop(); err != nil {
		l.log.Error().Err(err).Msg("closing: endpoint left behind")
		return err
	}
	return nil
}

// AwaitStop waits, after a Close begun elsewhere, for the loop's goroutine
// to end, as Close does: nil once it ended (its beforeEndpointClose ran
// and the endpoint is closed), or the *WedgedError of an endpoint stuck
// inside libfabric, which is never closed.
func (l *Loop) AwaitStop() error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-l.exited:
			return nil
		case <-tick.C:
			if err := l.Wedged(); err != nil {
				return err
			}
		}
	}
}

// Closing reports whether Close was called.
func (l *Loop) Closing() bool { return l.closing.Load() }

// Stopped reports whether the loop's goroutine has ended (after Close;
// not when Close gave up on a wedged endpoint).
func (l *Loop) Stopped() bool {
	select {
	case <-l.exited:
		return true
	default:
		return false
	}
}

func (l *Loop) kick() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
	if l.sleeping.Load() {
		l.port.signal()
	}
}

// run is the background goroutine: it progresses the endpoint when no
// waiter does, spinning for the policy's Spin after activity and then
// sleeping between polls — or parking, when nothing runs and no peer
// needs it to poll (mayPark).
func (l *Loop) run() {
	defer close(l.exited)
	sleep := l.policy.MinSleep
	yielded := monoNow()
	quiet := true
	spins := 0
	// roundNow: the pause of a loop that serves no peers ended; a round
	// follows at once. A passive loop would otherwise hand off first and
	// wait for a kick that the pause took already (a waiter's, whose job
	// then sat out the hand-off's pause).
	roundNow := false
	for {
		if l.closing.Load() {
			l.drive.Lock()
			l.shutdown()
			l.drive.Unlock()
			return
		}
		now := monoNow()
		handOff := l.passive && quiet && !roundNow && l.handOff(now)
		roundNow = false
		if handOff {
			// The callers of a passive loop wait for it (Wait, Poll): one
			// round per kick, on the kicker's thread while it parks,
			// instead of spinning beside it.
			l.handing.Store(true)
			l.pause(max(l.policy.MaxSleep, time.Millisecond))
			l.handing.Store(false)
		} else if !l.passive && (l.drivers.Load() > 0 || now-l.polled.Load() < int64(l.policy.MinSleep+time.Millisecond)) {
			// A waiter or a poller drives. Look again after
			// max(MaxSleep, 1ms): waking more often would take a CPU
			// from the spinning driver, or from its peer, on a small
			// machine.
			l.pause(max(l.policy.MaxSleep, time.Millisecond))
			continue
		}
		// The clock read above serves the round unless this goroutine
		// paused or waited for the lock since: a second read each round
		// was a tenth of a busy target's time.
		fresh := !handOff
		if !l.drive.TryLock() {
			l.drive.Lock()
			fresh = false
		}
		if !fresh {
			now = monoNow()
		}
		if l.peerWake.Load() && l.peerWake.Swap(false) { // a load first: this runs every round
			l.lastActive = now // Wake: spin, the peer's op may not be here yet
		}
		worked := l.iterate(now)
		l.ran.Add(1)
		if handOff {
			// The rounds of a passive loop's callers' Polls (Poll runs
			// none itself): peers' ops keep it active for PollIfWanted.
			worked = l.lookForPeers(now, worked)
		}
		idleFor := time.Duration(now - l.lastActive)
		woke := l.woke
		quiet = len(l.running) == 0 && l.inflight == 0
		l.drive.Unlock()
		if woke && !(handOff && quiet) {
			// The finished job's waiter, if parked, was made runnable on
			// this goroutine's P: let it run now, not at the next yield
			// (up to yieldEvery away) or whenever another thread steals
			// it — which on a loaded machine took as long. (Handing off,
			// this goroutine parks next, which lets it run.)
			runtime.Gosched()
			yielded = now
		}
		if l.pollers.Load() > 0 {
			select {
			case l.roundDone <- struct{}{}:
			default:
			}
		}
		if worked || handOff {
			// A long job whose rounds keep completing chunks finishes
			// none for a while: no yield above either.
			l.yieldIfDue(now, &yielded)
			sleep = l.policy.MinSleep
			continue
		}
		if idleFor < l.policy.Spin {
			if quiet && l.noPeers.Load() {
				// Nothing of its own runs, and no peer's op needs it:
				// the next op's waiter drives it, or kicks it (passive).
				// Spinning here took a CPU from that waiter, or from its
				// peer, on a small machine. Ops submitted with no waiter
				// start within this pause, as while a waiter drives, or
				// at a Nudge.
				l.pause(max(l.policy.MaxSleep, time.Millisecond))
				roundNow = true
				continue
			}
			l.yieldIfDue(now, &yielded)
			// A target serving a peer's stream completes nothing of its
			// own: its remote counter tells that it is not quiet.
			if spins++; spins&63 == 0 && idleFor > quietAfter && !l.peersActive() {
				l.yieldCPU()
			}
			continue
		}
		if l.peersActive() {
			continue
		}
		// A round follows an idle pause at once (roundNow): a passive
		// loop would otherwise hand off first when a waiter's kick ended
		// the pause, and wait for another kick that never comes.
		roundNow = true
		if quiet && l.mayPark() {
			// Nothing of ours is running: no deadline to watch, no
			// completion to wait for.
			if l.idle(l.parkFor, true) {
				sleep = l.policy.MinSleep
			}
			continue
		}
		if l.idle(sleep, false) {
			sleep = l.policy.MinSleep
			continue
		}
		sleep = min(2*sleep, l.policy.MaxSleep)
	}
}

// handOff reports whether a passive loop's callers drive it at now: a
// goroutine waits in Wait, or one left Wait or called Poll within the
// last millisecond (it is likely to come back at once).
func (l *Loop) handOff(now int64) bool {
	return l.waiters.Load() > 0 || now-l.polled.Load() < int64(l.policy.MinSleep+time.Millisecond)
}

// iterate is one round of progress at now (monoNow): take submissions,
// post, reap, check the event queue and deadlines. It reports whether
// anything happened. Under the drive lock.
func (l *Loop) iterate(now int64) bool {
	if l.down {
		return false
	}
	l.inCall.Store(now)
	defer l.inCall.Store(0)
	l.woke = false
	l.iter++
	if l.iter&15 == 0 {
		l.rounds.Store(uint64(l.iter))
	}
	worked := l.intake(now)
	if l.leftJobs.Load() > 0 {
		l.expireLeft()
	}
	l.checkMulti()
	if l.post() {
		worked = true
	}
	l.checkMulti() // the post may have run past a deadline (2.x's tcp sends inline; a refusal takes time too)
	if l.reap() {
		worked = true
	}
	if l.iter&1023 == 0 {
		l.pollEQ()
	}
	// By the round's clock, busy or not: a round that completes something
	// every time may take milliseconds (tcp moving megabytes), and a
	// busy job must still end at its deadline.
	if len(l.running) > 0 && (l.iter&255 == 0 || now-l.deadlineAt >= int64(deadlineGrain)) {
		l.deadlineAt = now
		l.checkDeadlines(time.Now(), now)
	}
	if worked {
		l.lastActive = now
		l.activeAt.Store(now)
	}
	return worked
}

// checkMulti checks the deadlines while a job of several chunks runs, by
// a clock of its own, before each call that could post or complete more
// of it: the round's clock may be old (Wait reads one only after a round
// that did something, and a reap that moved megabytes for tcp without
// completing an op did nothing), and a job past its deadline must not
// have more posted, nor be completed by a later call than the one under
// way at its deadline. Rounds read no clock here while only jobs of one
// chunk run (small ops). Under the drive lock.
func (l *Loop) checkMulti() {
	if l.multi > 0 {
		if t := monoNow(); t-l.deadlineAt >= int64(deadlineGrain) {
			l.deadlineAt = t
			l.checkDeadlines(time.Now(), t)
		}
	}
}

// yieldEvery is how often a spinning loop yields its thread to other
// goroutines (runtime.Gosched): often enough that a goroutine wanting to
// submit does not wait long, rarely enough that the runtime's thread
// wake-ups do not take a small machine's CPU from the peer
// (docs/ARCHITECTURE.md, "Progress").
const yieldEvery = time.Millisecond

// yieldIfDue yields when yieldEvery has passed since *yielded (monoNow).
func (l *Loop) yieldIfDue(now int64, yielded *int64) {
	if now-*yielded >= int64(yieldEvery) {
		runtime.Gosched()
		*yielded = now
		l.goYields.Add(1)
	}
}

// yieldShared is yieldIfDue for the goroutines that drive the endpoint
// in Wait or poll it, which may each spin only a moment at a time: it
// yields when none of them has for yieldEvery, so once a millisecond per
// loop between them (enough for one spinner an endpoint; of several, one
// may still go unyielded). A goroutine that runs for the runtime's 10 ms
// time slice mostly inside cgo calls has its P retaken by sysmon at every
// slice, and each retake puts sysmon back to its shortest sleeps; on a
// two-core host each of its wake-ups preempts a spinning side of a
// transfer (docs/ARCHITECTURE.md, "Progress").
func (l *Loop) yieldShared(now int64) {
	last := l.yieldedAt.Load()
	if now-last >= int64(yieldEvery) && l.yieldedAt.CompareAndSwap(last, now) {
		runtime.Gosched()
		l.goYields.Add(1)
	}
}

// yieldCPU gives the thread's CPU to the OS scheduler (sched_yield); a
// spinner calls it every 64 looks once it has seen nothing for
// quietAfter. The thread it waits for, a peer's or this process's, may be
// queued behind it on the same CPU, where the scheduler would let it run
// only after a slice of milliseconds (docs/PERFORMANCE.md). With nothing
// else to run on that CPU the call returns at once.
func (l *Loop) yieldCPU() {
	_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	l.cpuYields.Add(1)
}

// quietAfter: see yieldCPU. Longer than a small op takes while both sides
// run (tcp's take about 20 µs here), so that a healthy stream of ops, the
// endpoint's own or peers' toward it, never yields; 20 µs cut the first op's tail after an idle spell
// as well but doubled its median (docs/PERFORMANCE.md).
const quietAfter = 100 * time.Microsecond

// deadlineGrain is how often at most a round checks deadlines (and every
// 256th round does anyway): often enough for any deadline, rarely enough
// that reading the wall clock costs a spinning loop nothing.
const deadlineGrain = 50 * time.Microsecond

// intake takes the submitted jobs at now (monoNow: the round's clock, not
// a read per job). Under the drive lock.
func (l *Loop) intake(now int64) bool {
	if !l.queued.Load() {
		return false
	}
	l.mu.Lock()
	jobs := l.inbox
	l.inbox = l.spareJobs[:0]
	l.queued.Store(false)
	l.mu.Unlock()
	for _, j := range jobs {
		if len(j.Chunks) == 0 {
			j.running = -1
			l.finish(j, nil)
			l.settle(j)
			continue
		}
		j.running = len(l.running)
		j.checked = now
		if j.multi = len(j.Chunks) > 1; j.multi {
			l.multi++
		}
		l.running = append(l.running, j)
		l.active = append(l.active, j)
	}
	worked := len(jobs) > 0
	clear(jobs)
	l.spareJobs = jobs[:0]
	return worked
}

// pause waits for a kick or d. Only the background goroutine calls it.
func (l *Loop) pause(d time.Duration) {
	l.timer.Reset(d)
	select {
	case <-l.wake:
	case <-l.timer.C:
	}
	l.timer.Stop()
}

// post posts chunks of the active jobs, in order, as long as there are
// free slots, in one batch.
func (l *Loop) post() bool {
	if len(l.active) == 0 || len(l.free) == 0 {
		return false
	}
	l.batch = l.batch[:0]
	var bytes uint64
	for ai := 0; ai < len(l.active) && len(l.free) > 0 && len(l.batch) < l.postMax && bytes < postBytes; {
		j := l.active[ai]
		if j.finished || j.stopPosting || j.next >= len(j.Chunks) ||
			j.inflight > 0 && j.inflightBytes+j.Chunks[j.next].Len > jobInflight {
			ai++
			continue
		}
		slot := l.free[len(l.free)-1]
		l.free = l.free[:len(l.free)-1]
		c := &j.Chunks[j.next]
		bytes += c.Len
		j.inflightBytes += c.Len
		rec := slotRec{job: j, gen: j.gen.Load(), chunk: int32(j.next)}
		l.slots[slot] = rec
		flags := uint64(fabric.OpCompletion) | j.Flags
		l.port.set(len(l.batch), fabric.Op{Local: c.Local, Len: c.Len, Desc: c.Desc, Remote: c.Remote,
			Key: c.Key, Peer: j.Peer, Flags: flags, Slot: slot, Write: j.Op == Write})
		l.batch = append(l.batch, posting{rec, slot})
		j.next++
		j.inflight++
		l.inflight++
	}
	if len(l.batch) == 0 {
		l.compact()
		return false
	}
	posted, err := l.port.post(len(l.batch))
	l.posted.Add(uint64(posted))
	// A provider that answers FI_EAGAIN takes no more for now (shm takes
	// one delivery-complete write per peer at a time): the next round
	// tries one op more than went through, instead of preparing and
	// rewinding a whole batch each time; it grows back as ops go through.
	if posted < len(l.batch) {
		l.postMax = posted + 1
	} else {
		l.postMax = min(2*l.postMax, postBatch)
	}
	for i := len(l.batch) - 1; i >= posted; i-- {
		// Not posted: give the slot back and rewind the job.
		p := l.batch[i]
		j := p.rec.job
		j.inflight--
		j.inflightBytes -= j.Chunks[p.rec.chunk].Len
		l.inflight--
		if int(p.rec.chunk) < j.next {
			j.next = int(p.rec.chunk)
		}
		l.slots[p.slot] = slotRec{}
		l.free = append(l.free, p.slot)
	}
	for i := 0; i < posted; i++ {
		j := l.batch[i].rec.job
		j.Attempted++
		reachedProvider(j)
	}
	if err != nil && posted < len(l.batch) {
		reachedProvider(l.batch[posted].rec.job) // the op the provider refused
	}
	if err != nil && !errors.Is(err, fabric.ErrAgain) {
		// The op at index posted failed for good: fail its chunk.
		rec := l.batch[posted].rec
		j := rec.job
		var errno fabric.Errno
		errors.As(err, &errno)
		j.next = int(rec.chunk) + 1
		j.Attempted++
		j.Errs = append(j.Errs, l.chunkError(j, int(rec.chunk), errno, 0, "", true))
		j.stopPosting = true
		clear(l.batch)
		l.compact()
		l.maybeFinish(j) // last: j may be recycled once settled
		return posted > 0
	}
	clear(l.batch)
	l.compact()
	return posted > 0
}

// reachedProvider notes that a post of one of j's ops reached the
// provider, and runs OnPost the first time in j's use.
func reachedProvider(j *Job) {
	if !j.reached {
		j.reached = true
		if j.OnPost != nil {
			j.OnPost(j)
		}
	}
}

// postBytes bounds what one round posts: a provider may move an op's
// bytes inside the post call (2.1's tcp sends while the reader drains the
// socket), and the round's posts and reap are not interrupted by a
// deadline; a batch of a whole 256 MiB write once completed in one round,
// 895 ms past its deadline. A few chunks' worth: large transfers keep
// their queue full, small ops never reach it.
const postBytes = 16 << 20

// jobInflight bounds the bytes of one job in flight at once (or one
// chunk, when larger): what its deadline cannot stop once posted, and what
// goes on moving after its request timed out. Four rounds' worth of
// postBytes keeps a large transfer's queue full.
const jobInflight = 64 << 20

// compact drops the jobs at the front of active that have nothing left to
// post.
func (l *Loop) compact() {
	i := 0
	for i < len(l.active) {
		j := l.active[i]
		if !(j.finished || j.stopPosting || j.next >= len(j.Chunks)) {
			break
		}
		i++
	}
	if i > 0 {
		n := copy(l.active, l.active[i:])
		clear(l.active[n:])
		l.active = l.active[:n]
	}
}

// reap reads completions and error completions.
func (l *Loop) reap() bool {
	slots, err := l.port.reap()
	return l.handle(slots, err)
}

func (l *Loop) handle(slots []uint32, err error) bool {
	for _, s := range slots {
		l.complete(s, nil)
	}
	worked := len(slots) > 0
	if err == nil {
		return worked
	}
	if !errors.Is(err, fabric.ErrAvail) {
		l.log.Error().Err(err).Msg("reading the completion queue failed")
		return worked
	}
	for {
		e, ok, rerr := l.port.readErr()
		if rerr != nil {
			l.log.Error().Err(rerr).Msg("fi_cq_readerr failed")
			return true
		}
		if !ok {
			return true
		}
		l.complete(e.Slot, &e)
	}
}

func (l *Loop) complete(slot uint32, cqe *fabric.CQError) {
	if slot == fabric.NoSlot || int(slot) >= len(l.slots) || l.slots[slot].job == nil {
		if cqe != nil {
			l.log.Warn().Int("err", int(cqe.Err)).Int("prov_errno", cqe.ProvErrno).
				Str("prov_message", cqe.ProvMessage).Msg("error completion without an op")
		} else {
			l.log.Warn().Uint32("slot", slot).Msg("completion without an op")
		}
		return
	}
	rec := l.slots[slot]
	l.slots[slot] = slotRec{}
	l.free = append(l.free, slot)
	l.inflight--
	l.completed.Add(1)
	j := rec.job
	if j.gen.Load() != rec.gen {
		// The job settled and was reused while this op was out: nothing
		// of the new generation may be finished by it.
		l.stale++
		l.log.Error().Uint32("slot", slot).Msg("completion of an op whose transfer was already reused; dropped")
		return
	}
	j.inflight--
	j.inflightBytes -= j.Chunks[rec.chunk].Len
	switch {
	case j.finished:
		if cqe != nil {
			l.log.Debug().Str("peer", j.PeerName).Int("err", int(cqe.Err)).Msg("late error completion of a finished transfer")
		}
	case cqe != nil:
		j.Errs = append(j.Errs, l.chunkError(j, int(rec.chunk), cqe.Err, cqe.ProvErrno, cqe.ProvMessage, false))
		j.stopPosting = true
	default:
		j.Completed++
	}
	l.maybeFinish(j) // last: j may be recycled once settled
}

// maybeFinish finishes a job whose chunks are all done or that stopped,
// and settles it. The loop must not touch j afterwards: once settled, its
// submitter may recycle it.
func (l *Loop) maybeFinish(j *Job) {
	if !j.finished && j.inflight == 0 && (j.stopPosting || j.next >= len(j.Chunks)) {
		l.finish(j, nil)
	}
	l.settle(j)
}

// finish ends a job once: it leaves the running and posting queues, and
// its waiter is woken.
func (l *Loop) finish(j *Job, err error) {
	if j.finished {
		return
	}
	if err != nil {
		j.Errs = append(j.Errs, err)
	}
	j.finished = true
	l.takeLeft(j)
	if j.inflight > 0 && j.OnStrand != nil {
		j.OnStrand(j)
	}
	if i := j.running; i >= 0 && i < len(l.running) && l.running[i] == j {
		if j.multi {
			l.multi--
		}
		last := l.running[len(l.running)-1]
		l.running[i] = last
		last.running = i
		l.running[len(l.running)-1] = nil
		l.running = l.running[:len(l.running)-1]
	}
	j.running = -1
	l.dropActive(j)
	j.done <- struct{}{}
	l.woke = true
}

// dropActive removes a finished job from the posting queue.
func (l *Loop) dropActive(j *Job) {
	for i, a := range l.active {
		if a == j {
			n := copy(l.active[i:], l.active[i+1:])
			l.active[i+n] = nil
			l.active = l.active[:i+n]
			return
		}
	}
}

// expire finishes a job whose deadline passed or whose context ended.
func (l *Loop) expire(j *Job, cause error) {
	j.stopPosting = true
	l.finish(j, &TimeoutError{
		Op: j.Op, Provider: l.port.provider(), Peer: j.PeerName, Bytes: j.Bytes(),
		After: time.Since(j.Start), Completed: j.Completed, Total: len(j.Chunks), Cause: cause,
	})
	l.settle(j)
}

// CheckEvery is how often a running job's Check is called.
const CheckEvery = 100 * time.Millisecond

// checkDeadlines expires the running jobs whose deadline passed at now,
// and runs the Check of those due at mono (monoNow).
func (l *Loop) checkDeadlines(now time.Time, mono int64) {
	for i := 0; i < len(l.running); {
		j := l.running[i]
		if !j.Deadline.IsZero() && now.After(j.Deadline) {
			l.expire(j, context.DeadlineExceeded) // removes j from running
			continue
		}
		if j.Check != nil && mono-j.checked >= int64(CheckEvery) {
			j.checked = mono
			if err := j.Check(j); err != nil {
				j.stopPosting = true
				l.finish(j, err) // removes j from running
				l.settle(j)
				continue
			}
		}
		i++
	}
}

// settle runs OnIdle once a finished job has nothing in flight.
func (l *Loop) settle(j *Job) {
	if l.deferSettle {
		return // shutdown settles every job it holds once it is done with them
	}
	if j.finished && j.inflight == 0 && !j.idled {
		j.idled = true
		j.busy.Store(false)
		if j.OnIdle != nil {
			j.OnIdle(j)
		}
	}
}

func (l *Loop) chunkError(j *Job, chunk int, errno fabric.Errno, provErrno int, msg string, posting bool) error {
	c := &j.Chunks[chunk]
	prov := l.port.provider()
	return &Error{
		Op: j.Op, Provider: prov, Peer: j.PeerName, Offset: c.Offset, Len: c.Len,
		Errno: errno, ProvErrno: provErrno, ProvMessage: msg, Posting: posting,
		Hint: fabric.Hint(prov, errno, provErrno),
	}
}

func (l *Loop) pollEQ() {
	if ev := l.port.pollEQ(); ev != nil {
		prov := l.port.provider()
		l.log.Warn().Str("provider", prov).Int("err", int(ev.Errno)).Int("prov_errno", ev.ProvErrno).
			Str("eq_error", ev.Message).Str("hint", fabric.Hint(prov, ev.Errno, ev.ProvErrno)).
			Msg("asynchronous endpoint error")
	}
}

// idle waits for work for up to d: on the CQ's wait fd (block) when the
// CQ wakes on traffic, else on a kick or a timer. park marks the wait as a
// park (Submit wakes it). It reports whether completions or traffic
// arrived.
func (l *Loop) idle(d time.Duration, park bool) bool {
	if park {
		l.parked.Store(true)
		defer l.parked.Store(false)
	}
	if l.pending() {
		return false
	}
	if l.port.waitable() {
		return l.block(d)
	}
	// The wake channel keeps a kick that comes before the pause.
	l.pause(d)
	return false
}

// block is idle on a waitable endpoint: fi_trywait under the drive lock,
// then the wait on the CQ's fd without it — a goroutine that wants to
// drive the endpoint meanwhile takes the lock at once instead of waking
// this one first (a thread wake-up, up to 0.7 ms on a VM), and signals
// when it is done (wakeIfSleeping), since what it did may leave work
// that fi_trywait must see — then a read of the CQ, under the lock again.
func (l *Loop) block(d time.Duration) bool {
	l.drive.Lock()
	if l.down {
		l.drive.Unlock()
		return false
	}
	l.sleeping.Store(true)
	defer l.sleeping.Store(false)
	// Look again now that sleeping (and parked) are set: whoever changed
	// what pending reads after this signals, and the eventfd keeps a
	// signal sent before the wait.
	if l.pending() {
		l.drive.Unlock()
		return false
	}
	now := monoNow()
	l.inCall.Store(now)
	mayBlock, err := l.port.tryWait()
	l.inCall.Store(0)
	l.drive.Unlock()
	if err != nil {
		l.waitFailed(now, err, d)
		return false
	}
	// Something pending (fi_trywait said read first) or traffic that woke
	// the wait is activity, even when it completes nothing of ours (a
	// peer's RMA on this target): the loop spins after it, so peers that
	// keep a target busy find it polling instead of paying a wake-up per
	// op. A Signal alone is not: it says another goroutine drove the
	// endpoint, or wants the loop to look at its queue.
	busy := !mayBlock
	if mayBlock {
		if busy, err = l.port.block(max(int(d/time.Millisecond), 1)); err != nil {
			l.waitFailed(now, err, d)
			return false
		}
	}
	l.drive.Lock()
	defer l.drive.Unlock()
	if l.down {
		return false
	}
	l.checkMulti() // the wait may have outlasted a deadline
	l.inCall.Store(monoNow())
	slots, err := l.port.reap()
	l.inCall.Store(0)
	worked := l.handle(slots, err) || busy
	if worked {
		l.lastActive = monoNow()
		l.activeAt.Store(l.lastActive)
	}
	return worked
}

// waitFailed is block's answer to a failed fi_trywait or wait fd (never
// seen): it sleeps as a loop without a wait fd does, up to MaxSleep, so
// that the endpoint is still served without spinning on the error, and
// logs once a minute.
func (l *Loop) waitFailed(now int64, err error, d time.Duration) {
	if l.waitLogged == 0 || now-l.waitLogged >= int64(time.Minute) {
		l.waitLogged = now
		l.log.Error().Err(err).Msg("waiting on the CQ's fd failed: the loop sleeps between polls instead")
	}
	l.pause(min(d, l.policy.MaxSleep))
}

// wakeIfSleeping makes a background goroutine blocked on the CQ's fd look
// again (fi_trywait): for a goroutine that drove the endpoint while it
// was blocked, and is done.
func (l *Loop) wakeIfSleeping() {
	if l.sleeping.Load() {
		l.port.signal()
	}
}

// peersActive reports whether peers' RMA ops reached the endpoint since
// the last look (its remote counter moved): activity, as for a waitable
// endpoint traffic that wakes its wait. Only the background goroutine
// calls it, each round once Spin has passed since the last activity; an
// endpoint without a counter answers false without a call.
func (l *Loop) peersActive() bool {
	if !l.counted {
		return false
	}
	l.drive.Lock()
	defer l.drive.Unlock()
	if l.down {
		return false
	}
	return l.sawRemoteOps(monoNow())
}

// sawRemoteOps reads the remote counter at now and reports whether it
// moved (then activity). Under the drive lock, on a counted endpoint.
func (l *Loop) sawRemoteOps(now int64) bool {
	l.remoteLooked = now
	l.inCall.Store(now) // the read drives progress: a call like any other
	n := l.port.remoteOps()
	l.inCall.Store(0)
	if n == l.remoteSeen {
		return false
	}
	l.remoteSeen = n
	l.lastActive = now
	l.activeAt.Store(now)
	return true
}

// lookForPeers reads the remote counter after a polled round that did
// nothing (worked), at most every idlePollEvery: peers' ops make the
// endpoint active for PollIfWanted, as its own do. It reports whether the
// round or the counter showed activity.
func (l *Loop) lookForPeers(now int64, worked bool) bool {
	if worked || !l.counted || now-l.remoteLooked < int64(idlePollEvery) {
		return worked
	}
	return l.sawRemoteOps(now)
}

// pending reports whether something wants the background goroutine now:
// a submission, Close, a waiter driving, or a recent Poll.
func (l *Loop) pending() bool {
	l.mu.Lock()
	pending := len(l.inbox) > 0 || l.closing.Load()
	l.mu.Unlock()
	return pending || l.drivers.Load() > 0 || monoNow()-l.polled.Load() < int64(time.Millisecond)
}

// parkFor is how long a parked loop waits before it looks once anyway: a
// safety net, not a poll — what it waits for wakes it (traffic on a CQ
// with a wait object, a kick, an Attend).
const parkFor = time.Second

// mayPark reports whether an idle loop with nothing running may wait for
// work without polling: its CQ wakes on traffic (a wait fd), or every
// peer that needs its progress attends (ParkWhenUnattended) and none does.
func (l *Loop) mayPark() bool {
	return l.port.waitable() || l.attendOnly.Load() && l.attending.Load() == 0
}

// Parked reports whether the loop's goroutine is waiting for work without
// polling: blocked in the CQ's wait object, or (ParkWhenUnattended) until
// something wakes it.
func (l *Loop) Parked() bool { return l.parked.Load() }

// ParkWhenUnattended declares that every peer needing this endpoint's
// progress holds an Attend while it may need it. Then, while no one
// attends, an idle loop whose endpoint has no wait object parks instead of
// polling every MaxSleep. Without it such a loop keeps polling, as it must
// where peers arrive unannounced (efa: a remote peer's first packet needs
// the target's progress). Endpoints whose CQ wakes on traffic park
// regardless.
func (l *Loop) ParkWhenUnattended() { l.attendOnly.Store(true) }

// ServesNoPeers declares that no peer's op ever needs this endpoint's
// progress (no handle names it: an endpoint only for this process's own
// ops). Then, while nothing of its own runs, its goroutine looks every
// max(MaxSleep, 1ms) instead of spinning after activity: each op's waiter
// drives the endpoint itself, or kicks it (passive: a kick ends the
// pause, and a round follows at once), and a spinning goroutine beside it
// only takes a CPU. It still parks or sleeps as before once Spin has
// passed. A caller that submits a job and does other work before it waits
// for it calls Nudge.
func (l *Loop) ServesNoPeers() { l.noPeers.Store(true) }

// Nudge makes the loop's goroutine look now, not at the end of its pause:
// for a job submitted that its submitter does not wait for at once.
func (l *Loop) Nudge() { l.kick() }

// Wake makes the loop look now, and go on looking for its Spin as after
// activity: a peer's op that needs this endpoint's progress is on its way.
// An idle loop whose endpoint has no wait object otherwise sleeps up to
// MaxSleep between looks, and the op would wait for the next one.
func (l *Loop) Wake() {
	l.peerWake.Store(true)
	l.kick()
}

// Attend makes the loop poll its endpoint at least every MaxSleep while
// idle, until release is called (once): for a peer that may need this
// endpoint's progress at any time, on an endpoint with no wait object
// (ParkWhenUnattended). A parked loop starts polling at once.
func (l *Loop) Attend() (release func()) {
	l.attending.Add(1)
	l.kick()
	var once sync.Once
	return func() { once.Do(func() { l.attending.Add(-1) }) }
}

// Attending is how many Attend calls are not released yet.
func (l *Loop) Attending() int { return int(l.attending.Load()) }

// shutdownDrain is how long shutdown reaps completions of ops still in
// flight before it gives up an endpoint that is unsafe to close with them.
const shutdownDrain = 500 * time.Millisecond

// drain reaps completions until nothing is in flight or d passed.
func (l *Loop) drain(d time.Duration) {
	for end := time.Now().Add(d); l.inflight > 0 && time.Now().Before(end); {
		l.inCall.Store(monoNow())
		worked := l.reap()
		l.inCall.Store(0)
		if !worked {
			time.Sleep(time.Millisecond)
		}
	}
}

// shutdown fails every unfinished job, closes the endpoint and then
// settles every job, in flight or not; a job with ops in flight is
// failed (its waiter woken) only once they completed in the drain or the
// endpoint is closed. Under the drive lock.
func (l *Loop) shutdown() {
	seen := map[*Job]bool{}
	var jobs []*Job
	add := func(j *Job) {
		if j != nil && !seen[j] {
			seen[j] = true
			jobs = append(jobs, j)
		}
	}
	for _, j := range l.running {
		add(j)
	}
	for s := range l.slots {
		add(l.slots[s].job)
	}
	l.mu.Lock()
	for _, j := range l.inbox {
		j.running = -1
		add(j)
	}
	l.inbox = nil
	l.queued.Store(false)
	before, stopped, bound := l.beforeClose, l.stoppedPosting, l.stoppedBound
	l.mu.Unlock()
	for _, j := range jobs {
		if j.finished {
			continue
		}
		j.stopPosting = true
		if j.inflight == 0 {
			l.finish(j, ErrClosed)
			continue
		}
		// Its waiter hears of the close only once nothing of it can
		// move any more: when the drain below completed its ops
		// (maybeFinish), or after the endpoint is closed. Woken now, it
		// would return while the drain's reads still moved its bytes
		// into the caller's memory.
		j.Errs = append(j.Errs, ErrClosed)
	}
	unsafeClose := l.port.unsafeToCloseInFlight()
	if l.inflight > 0 && unsafeClose {
		// A job settled here would go back to its submitter (OnIdle),
		// which may reuse it, while the loop below still writes it.
		l.deferSettle = true
		l.drain(shutdownDrain)
		l.deferSettle = false
	}
	if stopped != nil {
		// Timed as a call that began at its bound: it reads other
		// processes' state, which may hang, and must not hang Close.
		stamp := monoNow() + int64(bound)
		l.inCall.Store(stamp)
		l.deferSettle = true // as in the drain: its reaps may complete ops
		stopped(func() bool {
			l.inCall.Store(monoNow())
			worked := l.reap()
			l.inCall.Store(stamp)
			return worked
		})
		l.deferSettle = false
		l.inCall.Store(0)
	}
	abandon := l.inflight > 0 && unsafeClose
	clear(l.slots)
	// beforeClose (closing registrations) and the close are libfabric
	// calls too: one that never returns wedges the endpoint (AwaitStop,
	// and waiters that would abort a job, report it). Each is timed by
	// itself, as the drain's reads are, not the shutdown as a whole.
	if before != nil {
		l.inCall.Store(monoNow())
		before()
	}
	if abandon {
		l.log.Warn().Int("in_flight", l.inflight).
			Msg("endpoint left open, not closed: closing it with ops in flight crashes libfabric 1.x's tcp;ofi_rxm; it is never progressed again")
		l.port.abandon()
	}
	// Closing the endpoint ends what the provider was doing with the
	// memory of ops still in flight; only then are they idle. (An
	// abandoned endpoint is never progressed again, which ends it too.)
	l.inCall.Store(monoNow())
	l.port.close()
	l.inCall.Store(0)
	l.down = true
	for _, j := range jobs {
		if !j.finished {
			l.finish(j, nil) // ErrClosed is among its errors already
		}
	}
	l.active, l.running = nil, nil
	for _, j := range jobs {
		j.inflight, j.inflightBytes = 0, 0
		l.settle(j)
	}
}
