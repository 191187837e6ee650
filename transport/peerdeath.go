package transport

import (
	"errors"
	"net"

	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/progress"
)

// afterPeerDeaths checks the shm endpoint when a verified same-node peer
// has died or left since the last check, where a dead peer can leave it
// blocked without its own loop noticing (libfabric.Route.SelfCheckNeeded):
// an op to itself, and a replacement when that op wedges (a region lock
// a dead peer held) or, on 2.x, is not served (a command queue it
// stalled: libfabric.ErrSelfCheckStalled). The verifier
// runs it when a peer's connection ends (left; the peer may be exiting,
// or just done), and a registration before it registers (nil: the
// pidfds of the peers still connected say who died), so that a buffer
// registered after a death the OS has reported does not land on an
// endpoint that death blocked — a peer given its handle would spin
// inside libfabric. A death the OS reports only later (the peer is still
// exiting) is caught when its connection ends.
//
// Checks are shared: one runs at a time, and one that began after a
// death covers it, so many peers leaving at once cost one or two checks;
// a registration waits for the one under way (up to twice the policy's
// WedgeAfter when it wedges). A check that fails otherwise than by
// wedging leaves the deaths unchecked, for the next registration or
// death to check again.
func (m *Manager) afterPeerDeaths(left *net.UnixConn) {
	v := m.verifier
	if v == nil {
		return
	}
	if b := m.backends().sameNode; b == nil || !b.SelfCheckNeeded() {
		return
	}
	seen := v.takeDeaths(left)
	m.deathsMu.Lock()
	defer m.deathsMu.Unlock()
	if m.deathsChecked >= seen {
		return // a check that began after these deaths covered them
	}
	b := m.backends().sameNode // the current one: a replacement may have come meanwhile
	if b == nil {
		return
	}
	seen = v.deathCount() // what this check covers: every death counted before it starts
	err := b.SelfCheck(v.stop)
	var we *progress.WedgedError
	switch {
	case err == nil:
		m.deathsChecked = seen
	case errors.As(err, &we), errors.Is(err, libfabric.ErrSelfCheckStalled):
		if m.replaceSameNode(b, err) == nil { // it logs what it did
			m.deathsChecked = seen
		}
	case v.stop.Err() == nil:
		m.log.Warn().Err(err).Str("provider", b.Name()).Msg("self check of the shm endpoint after a peer's death failed; the next registration checks again")
	}
}
