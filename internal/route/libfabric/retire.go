package libfabric

import (
	"context"
	"fmt"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
)

// RecyclesSlots reports whether shm may give a peer inserted on r a slot
// of its map that an earlier peer left, with that peer's handshake still
// in it: libfabric 2.x's shm. Its map hands slots out round robin over
// 256 and, when a removed peer's slot comes round again, the endpoint's
// record of the old handshake was never cleared (smr_map_del,
// prov/shm/src/smr_util.c, v2.1.0; smr_av.c, v2.6.0). The next op to the
// new peer skips the handshake and follows a region that was never
// mapped: a crash inside fi_writemsg or fi_readmsg. A new peer's own
// handshake (one that contacts this endpoint first) rewrites the record:
// only peers this endpoint inserts itself are at risk. docs/RELIABILITY.md
// has the details.
func (r *Route) RecyclesSlots() bool { return r.recycles }

// recyclesSlots is RecyclesSlots for a route of provider, for Open: a
// cgo call, not one per op.
func recyclesSlots(provider fabric.Backend) bool {
	return provider == fabric.BackendSHM && fabric.RuntimeVersion().Major() >= 2
}

// InFlight is how many chunks are posted and not completed on the
// endpoint: on the loop's goroutine only (CloseWith's function).
func (r *Route) InFlight() int { return r.loop.InFlight() }

// MapAdds bounds from above how many names this route added to shm's
// map since the endpoint opened: every new name it inserted, even one
// whose insert failed, and every name Admit counted. On a route that
// RecyclesSlots and that no peer reaches by itself, no slot comes round
// again while MapAdds stays below the map's 256 slots.
func (r *Route) MapAdds() int64 { return r.inserts.Load() }

// Admit counts the slot of shm's map that an op toward name will take,
// before the op inserts it, on a route that RecyclesSlots. It reports
// false when r is retiring, or when name is new to r and r's map took
// budget names already: the op picks another route then. A name r holds
// or counted already takes no new slot. Other routes admit every name
// while not retiring.
func (r *Route) Admit(name []byte, budget int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.retiring:
		return false
	case !r.recycles || r.peers[string(name)] != nil || r.pending[string(name)]:
		return true
	case r.inserts.Load() >= budget:
		return false
	}
	r.inserts.Add(1)
	if r.pending == nil {
		r.pending = map[string]bool{}
	}
	r.pending[string(name)] = true
	return true
}

// drainedHolds is holds once a retired route drained: no Hold succeeds.
const drainedHolds = -1 << 40

// Hold keeps r open for a request that picked it and has not yet taken
// its peers on it (PeerBy): a retired route closes only once no hold and
// no peer remain. It reports false once r drained (Retire): the request
// picks again. Unhold ends it.
func (r *Route) Hold() bool {
	for {
		h := r.holds.Load()
		if h < 0 {
			return false
		}
		if r.holds.CompareAndSwap(h, h+1) {
			return true
		}
	}
}

// Unhold ends a Hold.
func (r *Route) Unhold() {
	if r.holds.Add(-1) == 0 && r.Retired.Load() {
		r.maybeDrained()
	}
}

// Retire marks r retired and calls drained, on a goroutine of its own,
// once no request holds it and no peer of it is in use: the caller closes
// it then, and with it the peers' slots. It forgets no peer before: a
// request still holding r would insert a forgotten peer again, and each
// insert takes a new slot of shm's map, which is what a route that
// RecyclesSlots must not run out of. A route whose calls do not return
// never drains.
func (r *Route) Retire(drained func()) {
	r.mu.Lock()
	r.retiring, r.onDrained = true, drained
	r.mu.Unlock()
	r.Retired.Store(true)
	r.maybeDrained()
}

// maybeDrained calls the drained func of a retiring route once nothing
// holds it any more. Under r.mu, so that no peer is taken in between: a
// peer is taken under a hold, and a hold taken after the swap fails.
func (r *Route) maybeDrained() {
	r.mu.Lock()
	fire := r.retiring && !r.peerInUse() && r.holds.CompareAndSwap(0, drainedHolds)
	fn := r.onDrained
	r.mu.Unlock()
	if fire && fn != nil {
		go fn()
	}
}

// peerInUse reports whether a peer of r is in use (an Xfer holds it, or
// a caller of Peer has not called Done yet). Under r.mu.
func (r *Route) peerInUse() bool {
	for _, p := range r.peers {
		if p.uses.Load() > 0 {
			return true
		}
	}
	return false
}

// mapAddsMax is how many names a route that RecyclesSlots adds to shm's
// map at most (PeerBy refuses more): below the 256 slots, so that no
// insert gets a slot a removed peer left. Admit's budget stops new names
// well before; this stops inserts no Admit counted (a peer forgotten
// between its Admit and its op's insert is inserted again).
const mapAddsMax = 248

// mapFull is PeerBy's error past mapAddsMax. Past Admit's budget an
// Outgoing route admits no new name, so the next request toward the peer
// goes out on another endpoint (errclass.ErrRouteReplaced).
func (r *Route) mapFull(name []byte) error {
	what := fmt.Sprintf("this shm endpoint added %d names to libfabric's shm map, and another insert (%s) could get a slot a removed peer left, which libfabric %v follows into a region never mapped; the op was not sent",
		r.inserts.Load(), r.Addr(name), fabric.RuntimeVersion())
	if r.Outgoing {
		return fmt.Errorf("%w: %s; %w", errclass.ErrBlocked, what, errclass.ErrRouteReplaced)
	}
	return fmt.Errorf("%w: %s; close the manager and open a new one", errclass.ErrBlocked, what)
}

// LeaveSlots records names, peer endpoints that reached r by themselves
// and whose slots of shm's map nothing may free for now (ReleaseIncoming
// did not run for them: killed, closed with ops in flight, or gone to
// verify again), among those that this process maps the region of, as
// the kernel says (a name no op brought here takes no slot); it returns
// how many such slots are taken, each name once, until ReleaseIncoming
// frees it. On a route that RecyclesSlots (2.x) a full map (256) gives
// the next peer a slot in use (smr_map_add, whose check is an assert),
// and the endpoint then serves none of its peers.
func (r *Route) LeaveSlots(names [][]byte) int {
	mapped := shmRegionsMapped(names)
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, name := range names {
		if mapped[i] {
			if r.left == nil {
				r.left = map[string]bool{}
			}
			r.left[string(name)] = true
		}
	}
	return len(r.left)
}

// LeftSlots is how many slots LeaveSlots counts as taken now.
func (r *Route) LeftSlots() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.left)
}

// ReleaseIncoming frees the slot of shm's map that the peer endpoint
// name took when it reached this endpoint by itself (its handshake), and
// unmaps its region, once that endpoint closed: its region file is gone.
// shm keeps both for the endpoint's life otherwise, having no address of
// the peer to remove: an owner would keep every past peer's region
// mapped. shm finds the slot by name, so the name is inserted and
// removed again, after rounds of progress that process the commands the
// peer queued before it closed (shm answers them by slot). A name this
// route uses itself is Forget's. It reports false, and does nothing,
// while the file is there: the endpoint may still send. It gives up when
// the endpoint stays busy past deadline. Only for a name ShmNameOf pid
// accepts, on a route that RecyclesSlots (libfabric 2.x): its own ops
// never use such slots. The caller must know that nothing of that
// endpoint is under way here (a transfer through shm's bounce buffers
// is answered through the slot at every round): the peer said it closed
// with nothing in flight.
func (r *Route) ReleaseIncoming(ctx context.Context, deadline time.Time, name []byte, pid int) bool {
	if !r.recycles || !ShmNameOf(name, pid) {
		return true
	}
	if shmRegionExists(name) {
		return false
	}
	_ = r.loop.DoAfterRoundBy(ctx, deadline, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.peers[string(name)] != nil || shmRegionExists(name) {
			return
		}
		if _, err := r.loop.Endpoint().Peer(name); err == nil {
			r.loop.Endpoint().ForgetPeer(name)
			delete(r.left, string(name))
		}
	})
	return true
}
