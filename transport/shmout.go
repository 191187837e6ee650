package transport

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/progress"
)

// The shm endpoint this manager's own ops go out on.
//
// libfabric 2.x's shm hands out the 256 slots of an endpoint's peer map
// round robin, and a slot that a removed peer left comes round again
// with that peer's handshake still recorded: the next op to the peer
// inserted there follows a region never mapped, and crashes inside
// libfabric (libfabric.Route.RecyclesSlots). Peers that reach an
// endpoint by themselves take slots too, uncounted. So on 2.x the first
// shm endpoint (sameNode), whose name handles carry and peers reach,
// inserts no peer but itself, and this manager's own shm ops go out on
// an Outgoing endpoint (backendSet.shmOut) that no handle names and no
// peer reaches: its map takes only the names it inserts, which it
// counts (Route.Admit, before each op), and once it took shmMapBudget of
// them another takes over. The one replaced closes once no request
// holds it and no peer of it is in use (libfabric.Route.Retire). On 1.x
// the first endpoint does everything.

// shmMapBudget is how many names an Outgoing endpoint's map may take
// before another takes over: below shm's 256 slots, with room for the
// inserts no Admit counted (a peer forgotten between its op's Admit and
// its insert is inserted again).
var shmMapBudget int64 = 192

// shmOutgoing is the shm endpoint this manager's ops go out on: the
// Outgoing one where there is one, else sameNode.
func (bs *backendSet) shmOutgoing() *libfabric.Route {
	if bs.shmOut != nil {
		return bs.shmOut
	}
	return bs.sameNode
}

// holdShm readies b, the shm endpoint route picked for op o toward the
// endpoint name, for o: an Outgoing endpoint is held until the request
// ends (releaseOps), so that it does not close under it, and must admit
// name (Route.Admit). When b drained, retires, took its share of names,
// or has ops to a dead peer in flight (Route.Abandoned: shm completes an
// endpoint's ops in order, so later ones may never complete), the
// endpoint that takes its place is used instead (opened here in the last
// two cases): no handle names an Outgoing endpoint, so a new one costs
// peers nothing.
func (m *Manager) holdShm(o *opSpec, b *libfabric.Route, name []byte, t *reqTimes) (*libfabric.Route, error) {
	for b.Outgoing {
		if b.Hold() {
			if !b.Abandoned() && b.Admit(name, shmMapBudget) {
				if o.held != nil {
					o.held.Unhold()
				}
				o.held = b
				return b, nil
			}
			b.Unhold()
			if err := m.rotateShmOut(b, t); err != nil {
				return nil, err
			}
		}
		b = m.backends().shmOutgoing()
	}
	return b, nil
}

// newShmOut opens an Outgoing shm endpoint like from, at index i.
func (m *Manager) newShmOut(i int, from *libfabric.Route) (*libfabric.Route, error) {
	b, err := m.open(i, &from.Info, "this manager's own shm ops: no handle names it, and it is replaced once its map took its share of names", "outgoing")
	if err != nil {
		return nil, err
	}
	b.Outgoing = true
	b.ServesNoPeers()
	if err := b.RegisterScratch(m.guard.mem, guardEntrySize, scratchSlots); err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// rotateShmOut opens the Outgoing shm endpoint that takes over from old,
// which took its share of names or is stuck, and retires old. It does
// nothing when old is no longer the one ops go out on. It takes no hold
// of the manager (a request that holds it calls it), and does nothing
// once the manager closes: Close waits for one under way. A request (t)
// waits for the endpoint set within its limits: a registration holds the
// set while it waits for an endpoint, which may be inside a libfabric
// call for up to the poll policy's WedgeAfter; past them it gets a
// *progress.TimeoutError with Busy set.
func (m *Manager) rotateShmOut(old *libfabric.Route, t *reqTimes) error {
	if t == nil {
		m.replaceMu.Lock()
	} else if err := lockWithin(&m.replaceMu, t); err != nil {
		if errors.Is(err, ErrClosed) {
			return err
		}
		start, _ := t.get()
		return &progress.TimeoutError{Provider: string(fabric.BackendSHM), After: time.Since(start), Cause: err, Busy: true}
	}
	defer m.replaceMu.Unlock()
	if m.closing.Load() {
		return ErrClosed
	}
	cur := m.backends()
	if cur.shmOut != old {
		return nil
	}
	b, err := m.newShmOut(cur.indexes, old)
	if err != nil {
		m.log.Error().Err(err).Int64("names", old.MapAdds()).Msg("no new shm endpoint for this manager's ops")
		return fmt.Errorf("%w: this manager's shm endpoint for its own ops took %d names (libfabric %v's shm takes no more on one endpoint safely) or is stuck, and a new endpoint could not be opened: %v",
			ErrNoRoute, old.MapAdds(), fabric.RuntimeVersion(), err)
	}
	next := *cur
	next.all = append(append([]*libfabric.Route(nil), cur.all...), b)
	next.shmOut, next.indexes = b, cur.indexes+1
	m.set.Store(&next)
	old.Retire(func() { m.closeRetired(old) })
	m.log.Info().Int64("names", old.MapAdds()).Str("old", old.Address()).Str("new", b.Address()).
		Msg("shm endpoint took its share of peers: a new one sends this manager's shm ops")
	return nil
}

// closeRetired closes a retired shm endpoint that nothing holds any more
// (an Outgoing one, or a first one its peers left full: rotateIfFull),
// and the registrations buffers made on it, and drops it from the
// manager's set.
func (m *Manager) closeRetired(b *libfabric.Route) {
	if err := m.acquire(); err != nil {
		return // Close closes every endpoint
	}
	defer m.releaseManager()
	if err := m.closeWithMRs(b); err != nil {
		m.log.Error().Err(err).Str("endpoint", b.Address()).Msg("closing a retired shm endpoint")
		return
	}
	b.FreeScratch()
	if b.Outgoing {
		m.verified.sayDone(b) // the owners it was named to may free its slot
	}
	m.replaceMu.Lock()
	cur := m.backends()
	next := *cur
	next.all = make([]*libfabric.Route, 0, len(cur.all))
	for _, r := range cur.all {
		if r != b {
			next.all = append(next.all, r)
		}
	}
	m.set.Store(&next)
	m.replaceMu.Unlock()
	if b.Outgoing {
		m.shmOutClosed.Add(1)
	}
	m.log.Debug().Str("endpoint", b.Address()).Msg("retired shm endpoint closed")
}

// closeWithMRs closes endpoint b after the registrations buffers made on
// it (closeRoute).
func (m *Manager) closeWithMRs(b *libfabric.Route) error {
	m.bufsMu.Lock()
	bufs := m.registeredBufs(m.bufs)
	m.bufsMu.Unlock()
	return closeRoute(b, bufs, nil)
}

// closeRoute closes endpoint b after the registrations of bufs on it, on
// its loop (MRs must close before their endpoint); first there, when set,
// it runs also.
func closeRoute(b *libfabric.Route, bufs []*bufState, also func()) error {
	return b.CloseWith(func() {
		if also != nil {
			also()
		}
		for _, st := range bufs {
			st.closeMR(b.Index)
		}
	})
}

// closeOutgoing closes m's Outgoing shm endpoints, as Close begins, with
// the registrations of bufs on them, and reports whether none had an op
// in flight when its loop stopped posting (announceClean): then nothing
// of theirs is under way at an owner.
func (m *Manager) closeOutgoing(bufs []*bufState) bool {
	var busy atomic.Bool // set on a loop: one left stuck may run it later
	for _, b := range m.backends().all {
		if !b.Outgoing {
			continue
		}
		err := closeRoute(b, bufs, func() {
			if b.InFlight() > 0 {
				busy.Store(true)
			}
		})
		if err != nil || !b.Stopped() {
			busy.Store(true)
		}
	}
	return !busy.Load()
}

// maxOuts bounds the Outgoing endpoints of a peer's that one announcing
// connection keeps to free (announceOut): a peer names a new one per
// share of names its ops took; each that closed drained is freed when
// the peer says so (announceDone), and the rest when the connection ends
// after the peer said clean (announceClean).
const maxOuts = 64

// noteOut adds name, an Outgoing shm endpoint a peer (pid, as the kernel
// names it) says its ops come from toward sn, to outs, the names its
// announcing connection keeps, once each.
func (m *Manager) noteOut(sn *libfabric.Route, outs [][]byte, name []byte, pid int) [][]byte {
	if sn == nil || !sn.RecyclesSlots() || !libfabric.ShmNameOf(name, pid) || len(outs) >= maxOuts {
		return outs
	}
	for _, o := range outs {
		if string(o) == string(name) {
			return outs
		}
	}
	return append(outs, append([]byte(nil), name...))
}

// doneOut frees what name, one of outs, took here, now that the peer
// says that endpoint closed drained (announceDone): its manager closes
// one before itself only once no op holds it and no peer of it is in
// use (libfabric.Route.Retire). A name still there is kept for the end
// of the connection.
func (m *Manager) doneOut(sn *libfabric.Route, outs [][]byte, name []byte, pid int) [][]byte {
	for i, o := range outs {
		if string(o) == string(name) {
			if sn != nil && sn.ReleaseIncoming(context.Background(), time.Now().Add(retiredWait), o, pid) {
				return append(outs[:i], outs[i+1:]...)
			}
			return outs
		}
	}
	return outs
}

// releaseIncoming frees, on the first shm endpoint, what the handshakes
// of a peer's Outgoing endpoints took there (libfabric.Route.ReleaseIncoming),
// once the peer's manager closed them with no op in flight (it said so:
// announceClean) and they closed: peers reach that endpoint, and on
// libfabric 2.x a peer's ops come from endpoints whose names this manager
// never inserts itself, so nothing else frees them. A peer killed, or
// closed with ops in flight, keeps its slots here: a transfer of its
// through shm's bounce buffers may still be under way, which shm answers
// through the peer's slot (a freed one crashed owners in local CI). A
// peer's manager ends the connection before it closes its endpoints:
// each is looked at again every releaseEvery, for up to releaseWait, on a
// goroutine of its own (maxReleasers at once; past them, once). sn is
// the first shm endpoint the peer's connection began with: the one its
// endpoints reached.
func (m *Manager) releaseIncoming(sn *libfabric.Route, names [][]byte, pid int) {
	if sn == nil || len(names) == 0 || !sn.RecyclesSlots() {
		return
	}
	m.lookAgain(func() bool {
		left := names[:0]
		for _, name := range names {
			if !sn.ReleaseIncoming(context.Background(), time.Now().Add(retiredWait), name, pid) {
				left = append(left, name)
			}
		}
		names = left
		return len(names) == 0
	}, func(done bool) {
		if !done && !m.closing.Load() {
			m.leaveSlots(sn, names) // nothing will free them now
		}
	})
}

// lookAgain calls try until it reports true: every releaseEvery, for up
// to releaseWait, on a goroutine of its own (maxReleasers at once; past
// them, once, here), and no more once the manager closes. Then it calls
// then with try's last answer.
func (m *Manager) lookAgain(try func() bool, then func(done bool)) {
	if m.releasers.Add(1) > maxReleasers {
		m.releasers.Add(-1)
		then(try())
		return
	}
	go func() {
		defer m.releasers.Add(-1)
		done := false
		for end := time.Now().Add(releaseWait); !m.closing.Load(); time.Sleep(releaseEvery) {
			if done = try(); done || time.Now().After(end) {
				break
			}
		}
		then(done)
	}()
}

// Slots that peers leave taken. A peer endpoint that reached the first
// shm endpoint by itself keeps its slot of libfabric 2.x's shm map (256)
// until releaseIncoming frees it, which needs the peer to say it closed
// clean: a killed peer's slot, or one's that closed with ops in flight,
// stays taken for the endpoint's life. Once the map is full shm gives
// the next peer a slot in use (smr_map_add), and the endpoint then served
// none of its peers, the live ones included: 255 killed peers did that
// (docs/RELIABILITY.md). So a manager counts those slots
// (libfabric.Route.LeaveSlots) and replaces its first shm endpoint once
// leftBudget are taken and no peer attends it, or once those and the
// peers attending it (a slot each, at least) reach leftLimit with at
// least leftBudget/4 taken; the old one closes once its peers leave it
// (at most releaseWait later), which unmaps what the dead ones left. A
// peer verified before verifies again and learns the new endpoint; a
// buffer registered before keeps its other routes, as after a wedge
// (replaceSameNode), and its handle's shm part fails as stale. The
// budget is high, so that an owner whose peers hold old handles loses
// shm for them as late as is safe; what stays below 256 is room for
// slots nobody counted (a peer killed before it named its endpoint).
var (
	leftBudget = 192
	leftLimit  = 240
)

// leaveWhenGone records names, endpoints of a peer whose connection ended
// with no word that they closed clean, as leaving their slots of sn's map
// taken (leaveSlots) once the peer is known gone: its process exited
// (pidfd, which it closes), or those endpoints closed (their region files
// are gone) with their ops in flight (lookAgain). A peer still there then
// ended the connection to verify this manager again: its next connection
// speaks for those endpoints.
func (m *Manager) leaveWhenGone(sn *libfabric.Route, names [][]byte, pidfd int) {
	if sn == nil || !sn.RecyclesSlots() {
		_ = unix.Close(pidfd)
		return
	}
	m.lookAgain(func() bool {
		if !proc.PidfdExited(pidfd) && !libfabric.ShmRegionsGone(names) {
			return false
		}
		m.leaveSlots(sn, names)
		return true
	}, func(bool) { _ = unix.Close(pidfd) })
}

// leaveSlots records names, endpoints of a peer whose connection ended
// with no word that they closed clean, as leaving their slots of sn's map
// taken (libfabric.Route.LeaveSlots: only those whose region this process
// maps count, once each, until a later release frees them), and replaces
// sn when too many are (rotateIfFull).
func (m *Manager) leaveSlots(sn *libfabric.Route, names [][]byte) {
	if sn == nil || len(names) == 0 || !sn.RecyclesSlots() {
		return
	}
	left := sn.LeaveSlots(names)
	m.log.Debug().Int("names", len(names)).Int("left", left).Str("endpoint", sn.Address()).Msg("a peer left slots of the shm map taken")
	m.rotateIfFull(sn)
}

// rotateIfFull replaces sn, while it is the first shm endpoint, when its
// peers left too many slots of its map taken (leftBudget, leftLimit); one
// replacement at a time. The old endpoint closes once no peer attends
// it, or after releaseWait.
func (m *Manager) rotateIfFull(sn *libfabric.Route) {
	if sn == nil || !sn.RecyclesSlots() || sn.Retired.Load() || m.backends().sameNode != sn {
		return
	}
	left, attending := sn.LeftSlots(), sn.Attending()
	idle := left >= m.leftBudget && attending == 0
	crowded := left >= m.leftBudget/4 && left+attending >= m.leftLimit
	if !idle && !crowded || !m.rotating.CompareAndSwap(nil, sn) {
		return
	}
	go func() {
		defer m.rotating.Store(nil)
		why := fmt.Errorf("peers left %d slots of this shm endpoint's map taken (killed, or closed with ops in flight); libfabric %v's shm gives the next peer a slot in use once its 256 are",
			left, fabric.RuntimeVersion())
		if m.replaceSameNode(sn, why) != nil || m.backends().sameNode == sn {
			return
		}
		for end := time.Now().Add(releaseWait); sn.Attending() > 0 && time.Now().Before(end) && !m.closing.Load(); {
			time.Sleep(releaseEvery)
		}
		m.closeRetired(sn)
	}()
}

// releaseEvery, releaseWait, maxReleasers: see lookAgain.
const (
	releaseEvery = 20 * time.Millisecond
	releaseWait  = 10 * time.Second
	maxReleasers = 64
)
