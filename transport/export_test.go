package transport

import (
	"context"
	"errors"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
)

// testTimes is the limits of a request with no deadline of its own, as
// the manager's default timeout gives it.
func testTimes() *reqTimes {
	return &reqTimes{ctx: context.Background(), timeout: DefaultTimeout}
}

// ReplaceSameNode retires m's shm endpoint as if it were stuck inside
// libfabric, and opens another: the path a wedge takes, without the wedge.
func ReplaceSameNode(m *Manager) error {
	return m.replaceSameNode(m.backends().sameNode, errors.New("replaced by a test"))
}

// HoldEndpoint runs, on m's first endpoint, a call that returns only when
// release is closed: an endpoint stuck inside libfabric, as the loop sees
// it. It returns once the call holds the endpoint.
func HoldEndpoint(m *Manager, release <-chan struct{}) { holdEndpoint(m.backends().all[0], release) }

// HoldOpsEndpoint is HoldEndpoint on the endpoint m's own ops go out on:
// its first, or its Outgoing shm endpoint (libfabric 2.x).
func HoldOpsEndpoint(m *Manager, release <-chan struct{}) {
	b := m.backends().all[0]
	if out := m.backends().shmOut; out != nil {
		b = out
	}
	holdEndpoint(b, release)
}

func holdEndpoint(b *libfabric.Route, release <-chan struct{}) {
	held := make(chan struct{})
	go b.Do(func() {
		close(held)
		<-release
	})
	<-held
}

// GuardDirect reports whether m's shm handle checks read guard entries
// with process_vm_readv themselves (shmCheckDirect).
func GuardDirect(m *Manager) bool { return m.guardDirect }

// GuardOverShm makes m's shm handle checks read guard entries over shm,
// as where shm does not copy with process_vm_readv itself.
func GuardOverShm(m *Manager) { m.guardDirect = false }

// LoopsParked reports, by provider, whether the progress loop of each of
// m's libfabric backends is parked (waiting for work without polling); an
// Outgoing shm endpoint's is "shm/outgoing".
func LoopsParked(m *Manager) map[string]bool {
	out := map[string]bool{}
	for _, b := range m.backends().all {
		if !b.Retired.Load() {
			out[loopKey(b)] = b.Parked()
		}
	}
	return out
}

// loopKey names b's loop for LoopsParked, LoopRounds and LoopPolls.
func loopKey(b *libfabric.Route) string {
	if b.Outgoing {
		return b.Name() + "/outgoing"
	}
	return b.Name()
}

// SetFirstOpGrace sets how long an owner's shm loop polls for every peer
// that connects to its verifier, until restore is called.
func SetFirstOpGrace(d time.Duration) (restore func()) {
	old := firstOpGrace
	firstOpGrace = d
	return func() { firstOpGrace = old }
}

// EntryKept reports whether m keeps the guard entry of h's buffer at the
// generation its owner publishes now (entryCache): the next op's check
// reads nothing.
func EntryKept(m *Manager, h RemoteBuffer) bool {
	p, err := m.sameNodePeer(testTimes(), h.owner)
	if err != nil {
		return false
	}
	p.memMu.Lock()
	l := p.link
	p.memMu.Unlock()
	if l == nil || !l.hold() {
		return false
	}
	defer l.drop()
	for i := range h.eps {
		if g := h.eps[i].guard; g != nil && int(g.slot) < len(l.gens) {
			var entry [guardEntrySize]byte
			return l.lookup(g.slot, &entry)
		}
	}
	return false
}

// EntriesKept reports whether m keeps the guard entries of h's owner
// (entryCache): its mem link to the owner is up.
func EntriesKept(m *Manager, h RemoteBuffer) bool {
	p, err := m.sameNodePeer(testTimes(), h.owner)
	if err != nil {
		return false
	}
	p.memMu.Lock()
	defer p.memMu.Unlock()
	// Not while the dial's goroutine may still take memMu (to clear
	// dialing): an op then finds no link (linkForChecks' TryLock).
	return p.link != nil && !p.link.done.Load() && !p.dialing
}

// LoopRounds reports, by provider, how many rounds (to within 16 each)
// the progress loops of m's libfabric backends have run, summed over the
// backends of a provider (rails).
func LoopRounds(m *Manager) map[string]uint64 {
	out := map[string]uint64{}
	for _, b := range m.backends().all {
		if !b.Retired.Load() {
			out[loopKey(b)] += b.Rounds()
		}
	}
	return out
}

// LoopPolls counts, by backend, the polls of m's endpoints by callers
// (progress.Loop.Polls).
func LoopPolls(m *Manager) map[string]uint64 {
	out := map[string]uint64{}
	for _, b := range m.backends().all {
		if !b.Retired.Load() {
			out[loopKey(b)] += b.Polls()
		}
	}
	return out
}

// LoopPosted counts, by backend, the ops posted on m's endpoints so far
// (progress.Loop.Activity).
func LoopPosted(m *Manager) map[string]uint64 {
	out := map[string]uint64{}
	for _, b := range m.backends().all {
		if !b.Retired.Load() {
			posted, _ := b.Activity()
			out[loopKey(b)] += posted
		}
	}
	return out
}

// MemoOps counts the ops that took h's remembered mem routes (memFast),
// or -1 when h remembers none.
func MemoOps(h RemoteBuffer) int64 {
	if len(h.eps) == 0 || h.eps[0].guard == nil {
		return -1
	}
	n, any := int64(0), false
	for i := range h.eps[0].guard.memo {
		if mo := h.eps[0].guard.memo[i].Load(); mo != nil {
			n, any = n+int64(mo.taken.Load()), true
		}
	}
	if !any {
		return -1
	}
	return n
}

// HoldBuffer takes a reference on b as a transfer does; release ends it.
func HoldBuffer(b *Buffer) (release func(), err error) {
	if err := b.st.ref(); err != nil {
		return nil, err
	}
	return b.st.Unref, nil
}

// CloseWaits reports whether a Close of b has begun and waits for its
// transfers.
func CloseWaits(b *Buffer) bool {
	b.st.mu.Lock()
	defer b.st.mu.Unlock()
	return b.st.closed && b.st.drained != nil
}

// SetShmMapBudget sets how many names an Outgoing shm endpoint's map may
// take before another takes over the manager's shm ops, until restore is
// called. At least 2: a new endpoint has inserted itself.
func SetShmMapBudget(n int64) (restore func()) {
	if n < 2 {
		panic("SetShmMapBudget: a budget below 2 leaves a new endpoint no name to take")
	}
	old := shmMapBudget
	shmMapBudget = n
	return func() { shmMapBudget = old }
}

// ShmMapBudget is how many names an Outgoing shm endpoint's map takes
// before another takes over.
func ShmMapBudget() int64 { return shmMapBudget }

// OutgoingShm counts m's Outgoing shm endpoints: those in its set (the
// current one, and retired ones not closed yet), and those closed.
func OutgoingShm(m *Manager) [2]int {
	n := [2]int{0, int(m.shmOutClosed.Load())}
	for _, b := range m.backends().all {
		if b.Outgoing {
			n[0]++
		}
	}
	return n
}

// SetLeftSlotLimits sets, for t's life, how many slots of the first shm
// endpoint's map peers may leave taken before a manager opened meanwhile
// replaces it (leftBudget, leftLimit).
func SetLeftSlotLimits(t interface{ Cleanup(func()) }, budget, limit int) {
	oldBudget, oldLimit := leftBudget, leftLimit
	leftBudget, leftLimit = budget, limit
	t.Cleanup(func() { leftBudget, leftLimit = oldBudget, oldLimit })
}

// FirstShmAddress is the address of m's first shm endpoint, the one
// handles name.
func FirstShmAddress(m *Manager) string { return m.backends().sameNode.Address() }

// LeftSlots is how many slots of m's first shm endpoint's map its peers
// left taken, as m counts them (libfabric.Route.LeaveSlots).
func LeftSlots(m *Manager) int { return m.backends().sameNode.LeftSlots() }

// RequestsUnderWay counts m's requests that hold the manager or wait for
// their ops (Manager.requests).
func RequestsUnderWay(m *Manager) int64 { return m.requests.Load() }

// ShmEndpointNames are the names of m's shm endpoints (their regions'
// files are /dev/shm/PID:UID:INDEX).
func ShmEndpointNames(m *Manager) [][]byte {
	var out [][]byte
	for _, b := range m.backends().all {
		if b.Provider == fabric.BackendSHM {
			out = append(out, b.EndpointName())
		}
	}
	return out
}

// EndpointSetHeld reports whether something holds m's endpoint set
// (replaceMu): a registration, or a replacement of an endpoint.
func EndpointSetHeld(m *Manager) bool {
	if m.replaceMu.TryLock() {
		m.replaceMu.Unlock()
		return false
	}
	return true
}

// LeftOps counts the jobs left with ops in flight on b's memory (AddLeft).
func LeftOps(b *Buffer) int32 { return b.st.left.Load() }

// ShmHandshakesCleared is how many removed peers' handshakes m's shm
// endpoints cleared (libfabric.Route.HandshakesCleared: libfabric 1.x).
func ShmHandshakesCleared(m *Manager) int64 {
	var n int64
	for _, b := range m.backends().all {
		if b.Provider == fabric.BackendSHM {
			n += b.HandshakesCleared()
		}
	}
	return n
}

// SetMaxMemPeers makes managers hand out at most n use pages (mem links)
// until restore: with 0, every peer's link is refused.
func SetMaxMemPeers(n int) (restore func()) {
	old := maxMemPeers
	maxMemPeers = n
	return func() { maxMemPeers = old }
}
