package transport

import (
	"errors"
	"net"

	"github.com/fitransfer/fitransfer/progress"
)

// afterPeerDeaths checks the shm endpoint when a verified same-node peer
// has died since the last look, where a dead peer can leave it blocked
// without its own loop noticing (libfabric.Route.SelfCheckNeeded): an op
// to itself, and a replacement when that op wedges. The verifier runs it
// when a peer's connection ends (left; the peer may be exiting, or just
// done), and a registration before it registers (nil: the pidfds of the
// peers still connected say who died), so that a buffer registered after
// a peer's death never lands on an endpoint that death blocked — a peer
// given its handle would spin inside libfabric. One check at a time: a
// registration waits for one under way.
func (m *Manager) afterPeerDeaths(left *net.UnixConn) {
	v := m.verifier
	if v == nil {
		return
	}
	b := m.backends().sameNode
	if b == nil || !b.SelfCheckNeeded() {
		return
	}
	m.deathsMu.Lock()
	defer m.deathsMu.Unlock()
	if !v.takeDeaths(left) {
		return
	}
	if b = m.backends().sameNode; b == nil { // the current one: a replacement may have come meanwhile
		return
	}
	err := b.SelfCheck(v.stop)
	var we *progress.WedgedError
	switch {
	case errors.As(err, &we):
		_ = m.replaceSameNode(b) // it logs what it did
	case err != nil && v.stop.Err() == nil:
		m.log.Warn().Err(err).Str("provider", b.Name()).Msg("self check of the shm endpoint after a peer's death failed")
	}
}
