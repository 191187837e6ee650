package transport

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// memMemo is what routing found for a handle on the mem route: the
// verified owner, the link to it and the buffer's mapping. It is kept in
// the guard reference of the handle's mem endpoint, which every copy and
// slice of the handle shares, so that the next op on the handle (a
// ReadInto, a WriteFrom, an Action's) skips the owner, link and mapping
// lookups, which were most of an 8 B op's time. It is a hint, never a
// grant: each op checks again all that can change (take).
type memMemo struct {
	m     *Manager
	peer  *sameNodePeer
	link  *memLink
	mm    *memMap       // not held: an op takes it only while the link or another op holds it
	taken atomic.Uint64 // ops that took it (tests)
}

// usable reports whether the memo may still serve its manager's ops.
func (mo *memMemo) usable() bool {
	return !mo.m.down.Load() && !mo.peer.gone.Load() && !mo.peer.replaced.Load() && !mo.link.done.Load() && mo.mm.refs.Load() > 0
}

// keepMemo remembers o's route in its handle when it is new: in the slot
// of o's manager, else in a free one, else in one whose memo no longer
// serves, else in the last. Two managers of one process taking turns on a
// handle keep a memo each and allocate nothing; a third takes the last
// slot, in turn with the second.
func keepMemo(m *Manager, o *opSpec) {
	slots := &o.ep.guard.memo
	at := -1
	for i := range slots {
		cur := slots[i].Load()
		if cur != nil && cur.m == m {
			if cur.peer == o.peer && cur.link == o.link && cur.mm == o.mm {
				return
			}
			at = i
			break
		}
		if at < 0 && (cur == nil || !cur.usable()) {
			at = i
		}
	}
	if at < 0 {
		at = len(slots) - 1
	}
	slots[at].Store(&memMemo{m: m, peer: o.peer, link: o.link, mm: o.mm})
}

// memFast runs a single op on the handle's remembered mem route, when the
// handle has one for m that still holds; it reports false, having done
// nothing, for anything else, and the op takes the full path, which finds
// the route again or explains why there is none.
func (m *Manager) memFast(ctx context.Context, kind string, op progress.Op, local view, r *RemoteBuffer) (bool, error) {
	h := m.memo(r)
	if h == nil || local.st == nil || local.st.m != m || ctx.Err() != nil || local.st.left.Load() > 0 {
		return false, nil // the full path waits for ops left in flight (awaitLeft)
	}
	if m.acquire() != nil {
		return false, nil
	}
	if local.st.ref() != nil {
		m.releaseManager()
		return false, nil
	}
	mm, ok := h.take(op, local.st, r)
	if !ok {
		m.releaseManager()
		local.st.Unref()
		return false, nil
	}
	// Held through the copy, which ends at its next piece once Close
	// began (Quit): Close's hold of the manager waits for it, so nothing
	// copies after Close returned (the full path counts its copies:
	// Manager.copying).
	defer m.releaseManager()
	l := h.link
	defer l.drop()
	lim := route.Limit{Ctx: ctx, Quit: m.quit}
	if r.n > route.Piece { // as execute: a copy of one piece never looks at the clock
		times := reqTimes{ctx: ctx, timeout: m.cfg.timeout}
		lim.Start, lim.Deadline = times.get()
	}
	err := m.memOne(lim, op, local.st.mem[local.off:local.off+r.n], mm.b[r.off:r.off+r.n], l, mm, r.eps[0].guard, h.peer, r.id)
	local.st.Unref()
	switch {
	case err == nil:
		return true, nil
	case linkEnded(err):
		return false, nil // nothing moved: the full path dials again
	}
	errs := []error{err}
	m.closedErrs(errs)
	return true, &TransferError{Op: kind, Bytes: r.n, Ops: 1, Failed: 1, Errs: errs}
}

// memo is m's remembered mem route of the handle r, or nil. Register puts
// a mem endpoint first; a handle ordered otherwise has none.
func (m *Manager) memo(r *RemoteBuffer) *memMemo {
	if len(r.eps) == 0 {
		return nil
	}
	ep := &r.eps[0]
	if ep.guard == nil || ep.provider != mem.Name {
		return nil
	}
	for i := range ep.guard.memo {
		if mo := ep.guard.memo[i].Load(); mo != nil && mo.m == m {
			return mo
		}
	}
	return nil
}

// take holds the remembered route for an op of op on r from local (held
// by the caller): it returns the buffer's mapping, held, with the link
// held too (the caller lets go of both: unref, drop). It reports false,
// holding nothing, when the route no longer serves the op: the full path
// then finds it again or explains why there is none. Under the manager's
// hold: a closed manager's memo serves no op.
func (mo *memMemo) take(op progress.Op, local *bufState, r *RemoteBuffer) (*memMap, bool) {
	g, l, mm := r.eps[0].guard, mo.link, mo.mm
	if local.iface != mr.Host || !r.access.Allows(need(op)) || !mo.usable() {
		return nil, false
	}
	if mm.gen != g.gen || uint64(len(mm.b)) != r.size || r.off > r.size || r.n > r.size-r.off ||
		op == progress.Write && !mm.writable {
		return nil, false
	}
	if !mm.tryRef() {
		return nil, false
	}
	// The link's pages are read only while held: one that ended may be
	// freed.
	held := l.hold()
	if !held || l.gen(g.slot) != g.gen {
		if held {
			l.drop()
		}
		mm.unref()
		return nil, false
	}
	mo.taken.Add(1)
	return mm, true
}

// tryRef holds mm for an op unless its last holder let go of it (it is
// unmapped then, or about to be).
func (mm *memMap) tryRef() bool {
	for {
		n := mm.refs.Load()
		if n <= 0 {
			return false
		}
		if mm.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// linkEnded reports whether err is a memLinkEnded. The target errors.As
// needs is allocated where it is declared, so a nil err (every op that
// worked) answers before it.
func linkEnded(err error) bool {
	if err == nil {
		return false
	}
	var ended *memLinkEnded
	return errors.As(err, &ended)
}
