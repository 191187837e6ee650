package libfabric

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/progress"
)

// The tcp provider cannot refuse one RMA op: when the owner's key check
// fails (ofi_mr_verify in tcpx_op_read_req / tcpx_op_write, 1.17;
// xnet_handle_read_req / xnet_handle_write, 2.1) its progress loop shuts
// the connection down. The initiator's rxm hears of it from its internal
// event queue, which it reads at most every FI_OFI_RXM_CM_PROGRESS_INTERVAL
// (10 ms); until then it posts new ops on the dead socket, where they fail
// at once with FI_ENOTCONN, and afterwards it reconnects by itself. So an
// op that started after such a drop and failed on the dead connection is
// posted again, while its owner is alive, until rxm has a new connection.
// Reads and writes of the same bytes to the same place are idempotent.

// drop is the last dropped connection fitransfer saw to one tcp peer.
type drop struct {
	at      atomic.Int64 // UnixNano when a drop was seen; 0: none
	healthy atomic.Int64 // UnixNano of the first success to the peer after it
	// blind is when the last write to the peer that completed with
	// FI_INJECT_COMPLETE did (UnixNano), 0 once an op begun after it
	// succeeded: the owner may have refused that write and dropped the
	// connection without a word to it, and an op that then fails on the
	// dead socket is as much a victim as after a drop seen (blindDrop).
	blind atomic.Int64
}

// dropRetryPause is the pause between attempts on a dropped connection:
// the post fails within microseconds until rxm has read its event queue,
// and spinning on it would only burn the CPU rxm's peer needs.
const dropRetryPause = time.Millisecond

// staleConnWindow is how long after a drop ops are retried: rxm replaces
// the connection within one or two of its connection-progress intervals,
// so an op still failing after ten is failing for a reason of its own
// (its own key, say), and stops tearing the connection down.
var staleConnWindow = func() time.Duration {
	interval := 10 * time.Millisecond // rxm's default (rxm_init.c)
	if us, err := strconv.Atoi(os.Getenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL")); err == nil && us > 0 {
		interval = time.Duration(us) * time.Microsecond
	}
	return max(10*interval, 100*time.Millisecond)
}()

// ok records a success to the peer: the connection works again.
func (d *drop) ok(now int64) {
	if at := d.at.Load(); at != 0 && d.healthy.Load() <= at {
		d.healthy.Store(now)
	}
}

// sawUnacked records an unacknowledged write that completed at now,
// unless a later one did already.
func (d *drop) sawUnacked(now int64) {
	for {
		b := d.blind.Load()
		if b >= now || d.blind.CompareAndSwap(b, now) {
			return
		}
	}
}

// blindDrop records the drop that an unacknowledged write's refusal may
// have been, for a first attempt begun at start (after that write
// completed, with no drop seen since) that failed at now on a lost
// connection: as seen just before the attempt, so that it and its
// retries count as victims for the window from then, long enough for rxm
// to connect again. Posted right after the write, the attempt is usually
// in flight when the owner drops the connection (FI_ECANCELED), as an op
// whose own key the owner refused is: such an op is posted once more,
// refused again on the new connection, and its error stands then.
func (d *drop) blindDrop(start, now int64) {
	b := d.blind.Load()
	if b == 0 || start <= b || now-b >= int64(staleConnWindow) {
		return
	}
	// The earliest such attempt sets it: several in flight at once fail
	// in any order, and each must find itself after the drop.
	for {
		at := d.at.Load()
		if at >= b && at < start || d.at.CompareAndSwap(at, start-1) {
			return
		}
	}
}

// saw records a drop seen at now, unless it belongs to the drop already
// recorded (one within the window and not yet followed by a success).
func (d *drop) saw(now int64) {
	at := d.at.Load()
	if at != 0 && now-at < int64(staleConnWindow) && d.healthy.Load() <= at {
		return
	}
	d.at.Store(now)
}

// victim reports whether an attempt that started at start and failed at
// now may have met the connection the last drop left dead: it started
// after the drop, before any success since, within the window. An attempt
// that started earlier may have been the rejected op itself.
func (d *drop) victim(start, now int64) bool {
	at := d.at.Load()
	if at == 0 || start <= at || now-at >= int64(staleConnWindow) {
		return false
	}
	h := d.healthy.Load()
	return h <= at || start < h
}

// connLost reports whether every error of a job is its connection's loss:
// a socket error (fabric.ConnGone: FI_ENOTCONN, FI_ECONNRESET,
// FI_ECONNREFUSED, EPIPE) of an op posted to a lost connection, or,
// unless deadSocketOnly, rxm's flush (FI_ECANCELED) of ops it had in
// flight when the connection went down.
func connLost(errs []error, deadSocketOnly bool) bool {
	if len(errs) == 0 {
		return false
	}
	for _, e := range errs {
		var ce *progress.Error
		switch {
		case !errors.As(e, &ce):
			return false
		case ce.Errno == fabric.ErrCanceled:
			if deadSocketOnly {
				return false
			}
		case !fabric.ConnGone(ce.Errno):
			return false
		}
	}
	return true
}

// RedoAfterDrop posts x's job again while it failed only because it met
// a tcp connection that the owner had dropped after rejecting an earlier
// op, and the owner still listens (ownerLiveness, asked once, before the
// first retry): resubmit builds the same part of the op in a new Xfer and
// submits it, and RedoAfterDrop releases the one it replaces. It returns
// the Xfer whose job ended last, whether its failure is such a victim,
// and a *WedgedError from Wait. It costs nothing to a job that succeeded
// or failed otherwise.
func (r *Route) RedoAfterDrop(ctx context.Context, x *Xfer, start, deadline time.Time, resubmit func(old *Xfer) (*Xfer, error)) (*Xfer, bool, error) {
	d := x.probe.drop
	if d == nil {
		return x, false, nil
	}
	attempt, tries := start.UnixNano(), 0
	for {
		j := x.job
		if len(j.Errs) == 0 {
			// The clock only after a drop, or around an unacknowledged
			// write: every tcp op comes here.
			unacked := j.Op == progress.Write && j.Flags&uint64(fabric.OpInjectComplete) != 0
			if d.at.Load() != 0 || d.blind.Load() != 0 || unacked {
				now := time.Now().UnixNano()
				d.ok(now)
				if b := d.blind.Load(); !unacked && b != 0 && attempt > b {
					d.blind.CompareAndSwap(b, 0)
				}
				if unacked {
					d.sawUnacked(now)
				}
			}
			return x, false, nil
		}
		now := time.Now().UnixNano()
		if !connLost(j.Errs, false) {
			return x, false, nil // other errors: they explain it
		}
		// A retry that fails otherwise than on the dead socket reached a
		// live connection and lost it: its own key was rejected, most
		// likely, and posting it again would only drop the next one.
		onDead := connLost(j.Errs, true)
		if tries == 0 {
			d.blindDrop(attempt, now)
		}
		if tries > 0 && !onDead || !d.victim(attempt, now) {
			d.saw(now)
			return x, tries > 0 && onDead, nil
		}
		if tries == 0 {
			// The connection was lost at the drop: a dial aliveRecheck
			// after it, as here after a rejection that Explain has
			// explained, need not wait.
			addr := SockaddrHostPort(x.probe.name)
			if addr == "" || ownerLiveness(addr, time.Unix(0, d.at.Load()), deadline) != ownerListens {
				return x, false, nil // the owner is gone, or cannot be asked: Explain says so
			}
		}
		if time.Now().Add(dropRetryPause).After(deadline) || !sleepCtx(ctx, dropRetryPause) {
			return x, true, nil
		}
		attempt, tries = time.Now().UnixNano(), tries+1
		nx, err := resubmit(x)
		if err != nil {
			return x, true, nil // closing: the failure stands
		}
		x.Release()
		x = nx
		if err := r.loop.Wait(ctx, nx.job); err != nil {
			return x, true, err
		}
	}
}

// sleepCtx sleeps for d, or less when ctx ends: false then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Hints for tcp failures whose owner still listens: the connection was
// dropped by the owner's key check, not by the owner's exit.
const (
	hintRejected = "the owner is alive (its endpoint still listens) but dropped the connection: " +
		"tcp;ofi_rxm's target closes it when it rejects an RMA op's key, address or access " +
		"(a closed buffer, a stale or altered handle), and so fails this op or another one in flight to that owner with it; " +
		"check the handle, and get a fresh one from the owner"
	hintDroppedBefore = "the owner is alive (its endpoint still listens): it dropped the connection after rejecting an earlier op's key, " +
		"address or access (a closed buffer, a stale or altered handle), and rxm had not connected again within "
)
