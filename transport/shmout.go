package transport

import (
	"fmt"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
)

// The shm endpoint this manager's own ops go out on.
//
// libfabric 2.x's shm hands out the 256 slots of an endpoint's peer map
// round robin, and a slot that a removed peer left comes round again
// with that peer's handshake still recorded: the next op to the peer
// inserted there follows a region never mapped, and crashes inside
// libfabric (libfabric.Route.RecyclesSlots). Only peers the endpoint
// inserts itself are at risk; one that contacts it first handshakes
// anew. So an endpoint inserts peers only while no slot can have come
// round: while its map took fewer than shmMapBudget names (MapAdds: its
// inserts, and the contacts of its verifier as an upper bound of the
// peers that reached it). Then a new endpoint takes over this manager's
// shm ops (backendSet.shmOut, Outgoing): no handle names it, so that
// peers never reach it, and it is retired in turn once it took its
// share. A retired one closes once no op holds it (libfabric.Route.Retire).
// The first endpoint (sameNode), whose name handles carry, stays as it
// is for the peers that reach this manager's buffers.

// shmMapBudget is how many names an shm endpoint's map may take before
// the endpoint inserts no more peers: below shm's 256 slots, with room
// for the contacts that are counted as they connect, not as they
// handshake.
var shmMapBudget int64 = 192

// shmOut is the shm endpoint this manager's ops go out on: sameNode until
// it took its share of names, then an Outgoing one. It opens a new one
// when the current one took its share.
func (m *Manager) shmOut() (*libfabric.Route, error) {
	for {
		bs := m.backends()
		out := bs.shmOut
		if out == nil {
			out = bs.sameNode
		}
		if out == nil || !out.RecyclesSlots() || out.MapAdds() < shmMapBudget {
			return out, nil
		}
		if err := m.rotateShmOut(out); err != nil {
			return nil, err
		}
	}
}

// holdShm holds b, an shm endpoint route picked for an op, until the
// op's request ends (releaseOps): a retired Outgoing endpoint closes only
// once nothing holds it. When b drained since it was picked, the
// endpoint that took its place is held instead. The first endpoint is
// never closed before the manager: it needs no hold.
func (m *Manager) holdShm(o *opSpec, b *libfabric.Route) (*libfabric.Route, error) {
	for b.Outgoing {
		if b.Hold() {
			if o.held != nil {
				o.held.Unhold()
			}
			o.held = b
			return b, nil
		}
		var err error
		if b, err = m.shmOut(); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// rotateShmOut opens the Outgoing shm endpoint that takes over from old,
// which took its share of names, and retires old unless it is the first
// endpoint. It does nothing when old is no longer the one ops go out on.
func (m *Manager) rotateShmOut(old *libfabric.Route) error {
	if err := m.acquire(); err != nil {
		return err
	}
	defer m.releaseManager()
	m.replaceMu.Lock()
	defer m.replaceMu.Unlock()
	cur := m.backends()
	if out := cur.shmOut; out != old && !(out == nil && cur.sameNode == old) {
		return nil
	}
	b, err := m.open(len(cur.all), &old.Info, "this manager's own shm ops, once the endpoint before took its share of peers", "outgoing")
	if err == nil {
		b.Outgoing = true
		if err = b.RegisterScratch(m.guard.mem, guardEntrySize, scratchSlots); err != nil {
			_ = b.Close()
		}
	}
	if err != nil {
		m.log.Error().Err(err).Int64("names", old.MapAdds()).Msg("the shm endpoint took its share of peers, and no new one could be opened")
		return fmt.Errorf("%w: this manager's shm endpoint has met %d peers, as many as libfabric %s's shm can take on one endpoint safely, and a new endpoint could not be opened: %v",
			ErrNoRoute, old.MapAdds(), fabric.RuntimeVersion(), err)
	}
	next := *cur
	next.all = append(append([]*libfabric.Route(nil), cur.all...), b)
	next.shmOut = b
	m.set.Store(&next)
	if old.Outgoing {
		old.Retire(func() { m.closeRetired(old) })
	}
	m.log.Info().Int64("names", old.MapAdds()).Str("old", old.Address()).Str("new", b.Address()).
		Msg("shm endpoint took its share of peers: a new one sends this manager's shm ops")
	return nil
}

// closeRetired closes a retired Outgoing shm endpoint that nothing holds
// any more, and the registrations buffers made on it for their ops.
func (m *Manager) closeRetired(b *libfabric.Route) {
	if err := m.acquire(); err != nil {
		return // Close closes every endpoint
	}
	defer m.releaseManager()
	m.bufsMu.Lock()
	bufs := m.registeredBufs(m.bufs)
	m.bufsMu.Unlock()
	err := b.CloseWith(func() {
		for _, st := range bufs {
			st.closeMR(b.Index)
		}
	})
	if err != nil {
		m.log.Error().Err(err).Str("endpoint", b.Address()).Msg("closing a retired shm endpoint")
		return
	}
	b.FreeScratch()
	m.log.Debug().Str("endpoint", b.Address()).Msg("retired shm endpoint closed")
}
