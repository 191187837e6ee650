package transport

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/progress"
)

// entryCache keeps guard entries a manager read from one owner's table
// (with process_vm_readv: the cma route, shm's direct check; or over shm),
// so that the next op on the same buffer checks its handle without a
// system call or a round trip.
// An entry stands for one generation of its slot, and the owner's
// published generations (mapped through the mem link) say whether that
// generation is still the slot's: the owner publishes a slot's
// generation only after filling or emptying its entry (guardTable's
// publish and revoke). Direct-mapped by slot; a miss reads the entry
// again. Callers pass slots within the published generations.
type entryCache [entryCacheSize]atomic.Pointer[knownEntry]

const entryCacheSize = 64

// knownEntry is a guard entry as read, with its slot.
type knownEntry struct {
	slot  uint32
	entry [guardEntrySize]byte
}

// gen is the generation the entry was read at.
func (k *knownEntry) gen() uint64 { return binary.LittleEndian.Uint64(k.entry[8*gwGen:]) }

// lookup copies slot's entry into entry when the cache holds it at the
// generation the owner publishes now, and the owner lives (its pid is
// then not another process's).
func (l *memLink) lookup(slot uint32, entry *[guardEntrySize]byte) bool {
	k := l.entries[slot%entryCacheSize].Load()
	if k == nil || k.slot != slot || l.gen(slot) != k.gen() || !l.alive() {
		return false
	}
	*entry = k.entry
	return true
}

// readEntryVia reads slot's entry from the owner at addr with
// process_vm_readv, and keeps it (keep).
func (l *memLink) readEntryVia(o *opSpec, slot uint32, addr uint64, entry *[guardEntrySize]byte) error {
	before := l.gen(slot)
	if err := cma.ReadAt(o.op, o.peer.pid, addr, entry[:], o.remote.n); err != nil {
		return err
	}
	l.keep(slot, entry, before)
	return nil
}

// keep keeps slot's entry, read while the owner published generation
// before, when it is live: the published generation was the entry's
// before the read and still is after it, and it is odd (a buffer holds
// the slot: revoke makes it even). A read that overlapped a publish is
// used once, not kept. One that overlapped a revoke may be kept with the
// entry half emptied (revoke publishes the new generation last): its zero
// key and access refuse every op, as the revoke means to, until the new
// generation is published and lookup drops it. A place whose entry is
// still valid keeps it: two slots that share one would otherwise evict
// each other, each op an allocation.
func (l *memLink) keep(slot uint32, entry *[guardEntrySize]byte, before uint64) {
	gen := binary.LittleEndian.Uint64(entry[8*gwGen:])
	if gen&1 == 0 || gen != before || l.gen(slot) != before {
		return
	}
	c := &l.entries[slot%entryCacheSize]
	if k := c.Load(); k != nil && k.slot != slot && l.gen(k.slot) == k.gen() {
		return
	}
	c.Store(&knownEntry{slot: slot, entry: *entry})
}

// checksLink is the mem link to op o's owner whose kept entries serve its
// handle check, when one is up (linkForChecks), held (the caller drops
// it), or nil.
func (m *Manager) checksLink(o *opSpec) *memLink {
	if o.peer == nil {
		return nil
	}
	link := o.peer.linkForChecks()
	if link == nil || int(o.ep.guard.slot) >= len(link.gens) || !link.hold() {
		return nil // (matchesPeer bounds the slot; an owner's short page would not)
	}
	return link
}

// shmCheckKept checks the handle of op o, on the shm route, against its
// entry as kept from an earlier read, when the owner still publishes the
// generation it was read at: the op then needs no read of the entry over
// shm, a round trip through the owner's progress (libfabric 2.x, or a peer
// process_vm_readv does not reach). It reports false when none is kept,
// and sets in c the link and the generation under which verifyGuards
// keeps the entry it reads.
func (m *Manager) shmCheckKept(o *opSpec, c *guardCheck) (bool, error) {
	link := m.checksLink(o)
	if link == nil {
		return false, nil
	}
	slot := o.ep.guard.slot
	c.link, c.before = link, link.gen(slot)
	var entry [guardEntrySize]byte
	if !link.lookup(slot, &entry) {
		return false, nil // c, and the hold, go to verifyGuards (prepare drops it)
	}
	c.link = nil
	link.drop()
	if err := o.b.BlockedOrGone(progress.Read, o.ep.name); err != nil {
		return true, err // as verifyPeerGuards, before its read
	}
	return true, checkEntry(entry[:], &o.remote, o.ep, need(o.op), o.b.VirtAddr)
}

// linkForChecks is the mem link to p for the handle checks' cache (cma,
// shm) and the copies' marks (runCMA, markShmPart), when one is up,
// without waiting for one: when there is none it starts one in the
// background (one at a time, once the last failure allows: redialDue).
// route has waited for a link before it gave an op a same-node route
// (memLink), so an op finds none only when it ended since: the op then
// fails, nothing moved (linkEndedErr). A link that is up is found without
// memMu.
func (p *sameNodePeer) linkForChecks() *memLink {
	if l := p.up.Load(); l != nil && !l.done.Load() {
		return l
	}
	if !p.memMu.TryLock() {
		return nil // a dial, or another op starting one, holds it
	}
	l := p.link
	up := l != nil && !l.done.Load()
	if !up && !p.memDone && !p.dialing && (p.linkErr == nil || p.redialDue()) {
		p.startDial()
	}
	p.memMu.Unlock()
	if !up {
		return nil
	}
	return l
}
