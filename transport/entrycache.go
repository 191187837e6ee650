package transport

import (
	"encoding/binary"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/internal/route/cma"
)

// entryCache keeps guard entries a manager read from one owner's table
// with process_vm_readv (the cma route, and shm's direct check), so that
// the next op on the same buffer checks its handle without a system call.
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
// process_vm_readv and keeps it when it is whole and live: the published
// generation was the entry's before the read and still is after it (a
// read that overlapped a publish or a revoke is used once, not kept), and
// it is odd (a buffer holds the slot: revoke makes it even). A place whose
// entry is still valid keeps it: two slots that share one would otherwise
// evict each other, each op an allocation.
func (l *memLink) readEntryVia(o *opSpec, slot uint32, addr uint64, entry *[guardEntrySize]byte) error {
	before := l.gen(slot)
	if err := cma.ReadAt(o.op, o.peer.pid, addr, entry[:], o.remote.n); err != nil {
		return err
	}
	gen := binary.LittleEndian.Uint64(entry[8*gwGen:])
	if gen&1 == 0 || gen != before || l.gen(slot) != before {
		return nil // a revoked slot's, or a read that overlapped a change: used once
	}
	c := &l.entries[slot%entryCacheSize]
	if k := c.Load(); k != nil && k.slot != slot && l.gen(k.slot) == k.gen() {
		return nil // another slot's entry, still valid: slots that share a place take turns reading
	}
	c.Store(&knownEntry{slot: slot, entry: *entry})
	return nil
}

// linkForChecks is the mem link to p for the cma checks' cache, when one
// is up, without waiting for one: when there is none it starts one in the
// background (one at a time; after memRedial when the last failed), and
// ops read their entries meanwhile. A cma op must not wait for a dial (up
// to verifyTimeout toward an owner that does not answer, a stopped one
// say): it never needed the owner to answer before.
func (p *sameNodePeer) linkForChecks() *memLink {
	if !p.memMu.TryLock() {
		return nil // a dial holds it
	}
	l := p.link
	up := l != nil && !l.done.Load()
	dial := !up && !p.memDone && !p.dialing && (p.linkErr == nil || time.Since(p.linkAt) >= memRedial)
	p.dialing = p.dialing || dial
	p.memMu.Unlock()
	if dial {
		go func() {
			_, _ = p.memLink() // closeMem waits for it, and ends the link it made
			p.memMu.Lock()
			p.dialing = false
			p.memMu.Unlock()
		}()
	}
	if !up {
		return nil
	}
	return l
}
