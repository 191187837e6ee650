package libfabric

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/progress"
)

// Holder is the local buffer an Xfer's chunks use: the Xfer gives its
// reference back (Unref) when its last op is done, says when its ops
// may never complete (AddStuck), so that the buffer's Close need not wait
// for them, and counts a job its waiter left with ops in flight until the
// job is idle (AddLeft; ReleaseLeft).
type Holder interface {
	Unref()
	AddStuck(delta int)
	AddLeft(delta int)
}

// Use is a mark an Xfer keeps for the transport (HoldUse): a peer's use
// of the owner's buffer (the owner's use page), which the owner's Close
// waits for. It must outlive every call the loop makes for the job.
type Use interface {
	EndUse(slot uint32)
}

// Xfer is a job in flight on a route and what it holds: a reference on
// its local buffer, the peer address it posts to, and for handle checks
// scratch slots. Both the waiter and the loop (when no chunk is in flight
// any more) release it; the last release frees what it holds and
// recycles it. Until then the memory its chunks target stays registered
// and mapped.
type Xfer struct {
	r       *Route
	job     *progress.Job
	refs    atomic.Int32
	local   Holder
	scratch []uint32
	peer    *Peer // the address the job posts to; a use of it until released
	pid     int   // shm: the peer's process, for peerAlive
	dead    bool  // shm: abandoned with ops in flight to a dead peer
	// stuck: shm, ended with ops in flight that may never complete (set
	// by the loop, read by the waiter too: ReleaseLeft); left: the local
	// buffer counts the job as left in flight (ReleaseLeft), until
	// whichever of the job's idle, markStuck and the last release takes
	// it back first.
	stuck, left atomic.Bool
	probe       probe // tcp: the stall watch
	use         Use   // HoldUse's
	useSlot     uint32
	useEnded    atomic.Bool // endUse ran
	// WatchGen's: the owner's generation word of the job's buffer, the
	// handle's generation, and the hold that keeps the word mapped.
	genWord *uint64
	gen     uint64
	genHold interface{ Drop() }
}

var xferPool = sync.Pool{New: func() any {
	x := &Xfer{job: progress.NewJob()}
	x.job.Tag = x
	return x
}}

// NewXfer takes an Xfer for a job on r; it holds local's reference (the
// caller took it) until released.
func (r *Route) NewXfer(local Holder) *Xfer {
	x := xferPool.Get().(*Xfer)
	x.r, x.local = r, local
	x.job.OnIdle = xferIdle
	x.job.OnPost = xferPosted
	x.job.OnStrand = xferStranded
	x.refs.Store(1) // the waiter's; Submit adds the loop's
	return x
}

// HoldUse makes the Xfer end u (u.EndUse(slot)) once the loop is done
// with its job (OnIdle: every chunk completed), or at its last release
// when the job never reached the loop. Not at the last release only: the
// waiter releases an op's Xfer after the ops before it in its request,
// which may run long on other routes, and an owner's Close waits for
// the mark.
func (x *Xfer) HoldUse(u Use, slot uint32) { x.use, x.useSlot = u, slot }

// endUse ends HoldUse's mark, once: the loop's OnIdle and the waiter's
// last release may both call it.
func (x *Xfer) endUse() {
	if x.use != nil && x.useEnded.CompareAndSwap(false, true) {
		x.use.EndUse(x.useSlot)
	}
}

// WatchGen makes the job's Check (shm) end it with an ErrStaleHandle
// error once the owner's generation word of its buffer (word, mapped from
// a same-node owner) is no longer gen: the owner closed the buffer under
// the job. libfabric 2.x's shm owner drops an op on a closed registration
// without an answer (a marked part, HoldUse, is never posted after the
// owner's Close deregistered: Close waits for the mark), which would
// otherwise end at the deadline. hold
// keeps word mapped; it is dropped at the last release.
func (x *Xfer) WatchGen(word *uint64, gen uint64, hold interface{ Drop() }) {
	x.genWord, x.gen, x.genHold = word, gen, hold
}

// Job is the Xfer's job: its chunks before Submit, its outcome after.
func (x *Xfer) Job() *progress.Job { return x.job }

// Local is the buffer the Xfer holds.
func (x *Xfer) Local() Holder { return x.local }

// Aim points the job at peer p (whose use the Xfer now holds) for an op
// between start and deadline; pid is the owner's process on shm (0
// elsewhere). It sets the provider's liveness check.
func (x *Xfer) Aim(p *Peer, op progress.Op, start, deadline time.Time, pid int) {
	x.peer = p
	j := x.job
	j.Op, j.Peer, j.PeerName, j.Start, j.Deadline = op, p.addr, p.name, start, deadline
	switch x.r.Provider {
	case fabric.BackendSHM:
		x.pid, j.Check = pid, peerAlive
	case fabric.BackendTCP:
		x.probe.reset(p.raw, p.drop)
		j.Check = tcpPeerAlive
	}
}

// Submit hands the job to the route's loop.
func (x *Xfer) Submit() error {
	x.refs.Add(1)
	if err := x.r.loop.Submit(x.job); err != nil {
		x.refs.Add(-1)
		x.endUse() // nothing was posted; the waiter may release x much later
		return err
	}
	return nil
}

// xferPosted is the jobs' OnPost: the endpoint's first op toward a
// peer reached the provider (noteSent).
func xferPosted(j *progress.Job) {
	p := j.Tag.(*Xfer).peer
	if p != nil && !p.sent.Load() {
		p.sent.Store(true)
		p.r.noteSent(p)
	}
}

// xferIdle is the jobs' OnIdle: the loop's release.
func xferIdle(j *progress.Job) {
	x := j.Tag.(*Xfer)
	x.r.unstrand(x)
	x.unleave()
	if x.dead {
		x.r.deadOps.Add(-1) // its ops completed after all
	}
	if x.stuck.Load() && x.local != nil {
		x.local.AddStuck(-1)
	}
	x.endUse() // nothing of the job is in flight any more, or its endpoint closed
	x.Release()
}

// ReleaseLeft is Release for a waiter whose job ended before all of its
// ops had (a deadline, a cancel): while the loop still holds the job, its
// ops in flight may still write the local buffer (a read), and the
// buffer counts the job as left (Holder.AddLeft) until it is idle — or
// until its ops turn out never to complete (markStuck: a dead peer,
// whose ops move nothing).
func (x *Xfer) ReleaseLeft() {
	if x.local != nil && !x.stuck.Load() {
		// Counted before it is marked: whoever takes the mark back
		// (unleave) finds the count there.
		x.local.AddLeft(1)
		x.left.Store(true)
		if x.stuck.Load() {
			x.unleave() // markStuck ran meanwhile and found no mark
		}
	}
	x.Release()
}

// unleave takes back ReleaseLeft's count, once.
func (x *Xfer) unleave() {
	if x.left.CompareAndSwap(true, false) {
		x.local.AddLeft(-1)
	}
}

// Release is the waiter's release (the loop makes its own).
func (x *Xfer) Release() {
	if x.refs.Add(-1) != 0 {
		return
	}
	x.unleave()
	if x.local != nil {
		x.local.Unref()
	}
	for _, s := range x.scratch {
		x.r.Scratch.put(s)
	}
	if x.peer != nil {
		x.peer.Done()
		x.peer = nil
	}
	x.endUse()
	x.use = nil
	x.useEnded.Store(false)
	if x.genHold != nil {
		x.genHold.Drop()
		x.genWord, x.genHold = nil, nil
	}
	x.r, x.local, x.scratch, x.pid, x.dead = nil, nil, x.scratch[:0], 0, false
	x.stuck.Store(false)
	x.probe.name, x.probe.drop = nil, nil
	x.job.Reset()
	xferPool.Put(x)
}

// peerAlive is the Check of shm jobs: an shm peer whose process exited
// (proc.Gone: a zombie too) never answers, so the job ends as soon as
// that is known. Ops it leaves in flight may block the endpoint
// (Blocked), which also ends the jobs waiting behind them.
func peerAlive(j *progress.Job) error {
	x := j.Tag.(*Xfer)
	x.r.checkStranded()
	gone, why := proc.Gone(x.pid)
	if !gone {
		if err := x.r.Blocked(); err != nil {
			x.markStuck(j)
			return err
		}
		if x.genWord != nil && atomic.LoadUint64(x.genWord) != x.gen {
			// Its chunks in flight stay the loop's, as at a deadline: the
			// owner may still copy them into the local buffer, so they are
			// not counted as stuck. (A marked part, HoldUse, is all posted
			// before the owner's Close deregisters: no chunk of it is
			// dropped.)
			return fmt.Errorf("%s over shm to %s: %w: the owner closed the buffer while the op was in flight",
				j.Op, j.PeerName, errclass.ErrStaleHandle)
		}
		return nil
	}
	if j.InFlight() > 0 && !x.dead {
		x.dead = true
		x.r.abandonDead(j.PeerName)
	}
	x.markStuck(j)
	return &progress.PeerGoneError{Op: j.Op, Provider: string(fabric.BackendSHM), Peer: j.PeerName, Cause: why}
}

// Ops that finished jobs left in flight over shm.
//
// shm completes an endpoint's ops in order (see Blocked), so an op that
// is never answered holds back every later one of the endpoint, to any
// peer. A job whose waiter is gone checks nothing any more; the ops it
// left are watched here (stranded), from the Check of the jobs still
// running, for the three ways shm leaves them unanswered for good: the
// peer's process exited, its endpoint closed (its manager closed, the
// process alive: its region file is gone), or, on libfabric 2.x, the
// owner closed the buffer (its generation moved) and dropped what came
// after without an answer (a data path review: on 2.1 an owner whose
// manager closed under a write left the writer's outgoing endpoint
// completing nothing, for good, toward every owner). Such ops are
// abandoned as those to a dead peer are (abandonDead): the endpoint
// counts as blocked, and an Outgoing one is replaced.

// xferStranded is the jobs' OnStrand: on shm, the job's ops in flight
// are watched until they end (unstrand) or are abandoned.
func xferStranded(j *progress.Job) {
	x := j.Tag.(*Xfer)
	if x.r.Provider != fabric.BackendSHM || x.dead {
		return
	}
	if x.r.stranded == nil {
		x.r.stranded = map[*Xfer]*strandWatch{}
	}
	x.r.stranded[x] = &strandWatch{}
}

// strandWatch is what checkStranded saw of a stranded Xfer: since when
// its peer's endpoint or buffer looked gone (zero: not yet).
type strandWatch struct {
	suspect time.Time
}

// unstrand stops watching x: its job is idle. Under the drive lock.
func (r *Route) unstrand(x *Xfer) {
	if r.stranded != nil {
		delete(r.stranded, x)
	}
}

// strandGrace is how long the ops of a stranded job may stay in flight
// after their peer's endpoint or buffer is first seen gone before they
// count as never answered: ops the owner took before its close complete
// within it, and a live endpoint's file removed by someone else (shm's
// own cleanup, systemd's RemoveIPC) does not keep its ops waiting.
const strandGrace = 200 * time.Millisecond

// checkStranded abandons the stranded ops that shm will never answer; at
// most every CheckEvery. Under the drive lock (a running job's Check).
func (r *Route) checkStranded() {
	if len(r.stranded) == 0 {
		return
	}
	now := time.Now()
	if now.Sub(r.strandChecked) < progress.CheckEvery {
		return
	}
	r.strandChecked = now
	seen := map[*Peer]strandSight{} // each peer looked at once a check: many jobs may wait on one
	for x, w := range r.stranded {
		if x.job.InFlight() == 0 {
			continue // its completions are in; OnIdle unstrands it
		}
		sight, ok := seen[x.peer]
		if !ok {
			sight = x.lookAtPeer()
			seen[x.peer] = sight
		}
		dead := sight == peerDead
		if !dead {
			moved := fabric.RuntimeVersion().Major() >= 2 && x.genWord != nil && atomic.LoadUint64(x.genWord) != x.gen
			if sight != peerClosed && !moved {
				w.suspect = time.Time{}
				continue
			}
			if w.suspect.IsZero() {
				w.suspect = now
			}
			if now.Sub(w.suspect) < strandGrace {
				continue
			}
		}
		delete(r.stranded, x)
		x.dead = true
		r.abandonDead(x.job.PeerName)
		if dead {
			// A process that exited copies nothing more. An endpoint that
			// looks closed, or a buffer closed under a transfer that shm
			// moves in rounds, may still: its local buffer keeps waiting.
			x.markStuck(x.job)
		}
	}
}

// strandSight is what checkStranded sees of a peer.
type strandSight int

const (
	peerThere  strandSight = iota
	peerClosed             // its region file is gone: its endpoint closed
	peerDead               // its process exited
)

// lookAtPeer says whether x's peer's process exited, or its endpoint's
// region file is gone.
func (x *Xfer) lookAtPeer() strandSight {
	if gone, _ := proc.Gone(x.pid); gone {
		return peerDead
	}
	if x.peer != nil && !shmRegionExists(x.peer.raw) {
		return peerClosed
	}
	return peerThere
}

// markStuck records, once, that x ends with ops in flight that may never
// complete (the peer died, or the endpoint is blocked behind such ops):
// its local buffer's Close need not wait for them.
func (x *Xfer) markStuck(j *progress.Job) {
	if x.stuck.Load() || j.InFlight() == 0 || x.local == nil {
		return
	}
	x.stuck.Store(true)
	x.local.AddStuck(1)
	x.unleave()
}
