package transport

import (
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/proc"
	"sync"
	"sync/atomic"

	"github.com/fitransfer/fitransfer/progress"
)

// xfer is a job in flight and what it holds: a reference on its local
// buffer and, for handle checks, scratch slots. Both the waiter and the
// loop (when no chunk is in flight any more) release it; the last release
// frees what it holds and recycles it. Until then the memory its chunks
// target stays registered and mapped.
type xfer struct {
	m       *Manager
	b       *backend
	job     *progress.Job
	refs    atomic.Int32
	local   *bufState
	target  *bufState // memcpy only
	scratch []uint32
	peer    *peer    // the address the job posts to; a use of it until released
	pid     int      // shm: the peer's process, for peerAlive
	dead    bool     // shm: abandoned with ops in flight to a dead peer
	stuck   bool     // shm: ended with ops in flight that may never complete
	probe   tcpProbe // tcp: the stall watch
}

var xferPool = sync.Pool{New: func() any {
	x := &xfer{job: progress.NewJob()}
	x.job.Tag = x
	return x
}}

func (m *Manager) newXfer(b *backend) *xfer {
	x := xferPool.Get().(*xfer)
	x.m, x.b = m, b
	x.job.OnIdle = xferIdle
	x.refs.Store(1) // the waiter's; submit adds the loop's
	return x
}

// submit hands the job to the backend's loop.
func (x *xfer) submit() error {
	x.refs.Add(1)
	if err := x.b.loop.Submit(x.job); err != nil {
		x.refs.Add(-1)
		return err
	}
	return nil
}

// xferIdle is the jobs' OnIdle: the loop's release.
func xferIdle(j *progress.Job) {
	x := j.Tag.(*xfer)
	if x.dead {
		x.b.deadOps.Add(-1) // its ops completed after all
	}
	if x.stuck && x.local != nil {
		x.local.addStuck(-1)
	}
	x.release()
}

func (x *xfer) release() {
	if x.refs.Add(-1) != 0 {
		return
	}
	if x.local != nil {
		x.local.unref()
	}
	for _, s := range x.scratch {
		x.b.scratch.put(s)
	}
	if x.peer != nil {
		x.peer.done()
		x.peer = nil
	}
	x.m, x.b, x.local, x.target, x.scratch, x.pid, x.dead, x.stuck = nil, nil, nil, nil, x.scratch[:0], 0, false, false
	x.probe.name, x.probe.drop = nil, nil
	x.job.Reset()
	xferPool.Put(x)
}

// peerAlive is the Check of shm jobs: an shm peer whose process exited
// (processGone: a zombie too) never answers, so the job ends as soon as
// that is known. Ops it leaves in flight may block the endpoint
// (backend.blocked), which also ends the jobs waiting behind them.
func peerAlive(j *progress.Job) error {
	x := j.Tag.(*xfer)
	gone, why := proc.Gone(x.pid)
	if !gone {
		err := x.b.blocked()
		if err != nil {
			x.markStuck(j)
		}
		return err
	}
	if j.InFlight() > 0 && !x.dead {
		x.dead = true
		x.b.abandonDead(j.PeerName)
	}
	x.markStuck(j)
	return &progress.PeerGoneError{Op: j.Op, Provider: string(fabric.BackendSHM), Peer: j.PeerName, Cause: why}
}

// markStuck records, once, that x ends with ops in flight that may never
// complete (the peer died, or the endpoint is blocked behind such ops):
// its local buffer's Close need not wait for them.
func (x *xfer) markStuck(j *progress.Job) {
	if x.stuck || j.InFlight() == 0 || x.local == nil {
		return
	}
	x.stuck = true
	x.local.addStuck(1)
}
