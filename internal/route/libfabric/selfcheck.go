package libfabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// SelfCheckNeeded reports whether a peer process that died can leave the
// endpoint unusable without its own loop ever noticing: libfabric 1.x's
// shm lets a peer hold this endpoint's region lock for a whole copy, and
// looks at the lock only when the peer signalled it — so a peer killed
// mid-copy blocks every later peer inside its fi_write, while this side's
// progress calls go on returning (prov/shm/src/smr_rma.c, smr_progress.c,
// v1.17.0). On 2.x, see stallsSilently.
func (r *Route) SelfCheckNeeded() bool {
	return r.Scratch != nil && (r.loop.Endpoint().CallsMayNeverReturn() || r.stallsSilently())
}

// stallsSilently reports whether a dead peer can stop this endpoint from
// reading any command again while its progress calls go on returning:
// libfabric 2.x's shm, where a peer claims a slot of this endpoint's
// command queue, fills it, then commits it (smr_generic_rma,
// prov/shm/src/smr_rma.c, v2.1.0), and the reader stops at a claimed slot
// not committed yet (ofi_atomic_queue.h) — for good when that peer was
// killed in between.
func (r *Route) stallsSilently() bool {
	return r.Provider == fabric.BackendSHM && fabric.RuntimeVersion().Major() >= 2
}

// ErrSelfCheckStalled is a self check whose read the endpoint did not
// serve within its policy's WedgeAfter while its progress calls returned
// (stallsSilently): a dead peer left its command queue stalled.
var ErrSelfCheckStalled = errors.New("the shm endpoint serves no command: a dead peer left a slot of its command queue claimed and never committed")

// SelfCheck reads the first entry of the route's own guard table through
// its own endpoint: on shm an op to oneself takes the region lock as a
// peer's does, so it completes when the lock is free and wedges the
// endpoint (a *progress.WedgedError within the policy's WedgeAfter) when
// a dead process holds it. It needs Scratch.
func (r *Route) SelfCheck(ctx context.Context) error {
	s := r.Scratch
	if s == nil {
		return errors.New("self check: the route has no scratch memory")
	}
	p, err := r.Peer(r.name)
	if err != nil {
		return err
	}
	start := time.Now()
	// Past the wedge: a stuck read ends as wedged, not as late. An
	// endpoint that stalls silently wedges nothing: its read stays unserved.
	deadline := start.Add(2 * r.loop.WedgeAfter())
	if r.stallsSilently() {
		deadline = start.Add(r.loop.WedgeAfter())
	}
	x := r.NewXfer(nil)
	x.Aim(p, progress.Read, start, deadline, os.Getpid())
	// The waiter's hold; a loop that keeps the job (wedged) keeps its own.
	defer x.Release()
	if _, err := x.ReadEntry(ctx, deadline, mr.RemoteAddr(r.VirtAddr, s.tableAt, 0), s.TableKey()); err != nil {
		var to *progress.TimeoutError
		if errors.As(err, &to) { // the op's fields, which ReadEntry leaves to its caller
			to.Op, to.Peer, to.After = progress.Read, "itself", time.Since(start)
		}
		return err
	}
	if err := x.Submit(); err != nil {
		return err
	}
	// Not Wait, which may drive the endpoint itself: a dead peer can
	// leave its region lock held, on which a post or a progress call then
	// spins for good (smr_format_sar, smr_get_txbuf, smr_release_txbuf,
	// prov/shm/src, v2.1.0); the check must come back and report it. (On
	// shm, passive, the two wait alike.)
	if err := r.loop.Await(ctx, x.job); err != nil {
		var to *progress.TimeoutError
		if errors.As(err, &to) && to.Left && r.stallsSilently() {
			// A call has held the endpoint since before the deadline,
			// which is WedgeAfter on 2.x (2 × WedgeAfter on 1.x, where
			// the wedge comes first): it wedges within WedgeAfter of its
			// start, or returns.
			if we := r.awaitWedge(ctx); we != nil {
				return we
			}
		}
		return err // a wedged loop keeps the job, and its own hold on the scratch
	}
	if j := x.Job(); len(j.Errs) > 0 {
		var to *progress.TimeoutError
		// Not only a read posted and never served: on a stalled queue the
		// read to itself is refused (FI_EAGAIN) and never posted, like one
		// that waits behind others' posts (see docs/RELIABILITY.md).
		if r.stallsSilently() && ctx.Err() == nil && errors.As(j.Errs[0], &to) && !to.Left {
			return fmt.Errorf("self check: %w (%w)", ErrSelfCheckStalled, j.Errs[0])
		}
		return fmt.Errorf("self check: %w", j.Errs[0])
	}
	return nil
}

// awaitWedge waits up to the loop's WedgeAfter for the call under way to
// wedge the endpoint, and returns that *progress.WedgedError; nil when
// none did (no call was under way, it returned, or ctx ended).
func (r *Route) awaitWedge(ctx context.Context) error {
	call := r.loop.CallStart()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	end := time.Now().Add(r.loop.WedgeAfter())
	for {
		if err := r.loop.Wedged(); err != nil {
			return err
		}
		if call == 0 || r.loop.CallStart() != call || time.Now().After(end) {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
