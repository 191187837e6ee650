package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/progress"
)

// CMAError is a failed copy on the cma route (process_vm_readv/writev):
// the errno, and which bytes of which op.
type CMAError = cma.Error

// CMAAvailable reports whether managers of this process move same-node
// bytes themselves with process_vm_readv/writev (the cma route), and why
// not when they do not.
func CMAAvailable() (bool, string) { return cma.Available() }

// MemAvailable reports whether managers of this process use the mem
// route, and why not when they do not (FITRANSFER_MEM=0, or yama's
// ptrace_scope above 0: see mr.Shares).
func MemAvailable() (bool, string) { return mem.Enabled() }

// cmaEntries keeps the guard entries one request has read, so that its
// ops on the same buffer cost one process_vm_readv, not one each.
type cmaEntries struct {
	n    int
	keys [4]struct {
		pid  int
		addr uint64
	}
	entries [4][guardEntrySize]byte
}

// readEntry reads into entry the guard entry of op o's buffer from its
// owner's table with process_vm_readv, at the address the verified owner
// gave — or takes it from seen, when this request already read it, or
// from link's cache (nil: none), when the owner still publishes the
// generation it was read at (entryCache).
func (m *Manager) readEntry(o *opSpec, seen *cmaEntries, entry *[guardEntrySize]byte, link *memLink) error {
	pid := o.peer.pid
	slot := o.ep.guard.slot
	addr := o.peer.cma.table + uint64(slot)*guardEntrySize
	for i := 0; i < seen.n; i++ {
		if seen.keys[i].pid == pid && seen.keys[i].addr == addr {
			*entry = seen.entries[i]
			return nil
		}
	}
	switch { // without a link, every op reads the entry
	case link != nil && link.lookup(slot, entry):
	case link != nil:
		if err := link.readEntryVia(o, slot, addr, entry); err != nil {
			return err
		}
	default:
		if err := cma.ReadAt(o.op, pid, addr, entry[:], o.remote.n); err != nil {
			return err
		}
	}
	if seen.n < len(seen.keys) {
		seen.keys[seen.n].pid, seen.keys[seen.n].addr = pid, addr
		seen.entries[seen.n] = *entry
		seen.n++
	}
	return nil
}

// cmaCheck reads the buffer's guard entry from its owner (or takes it from
// seen, when this request already read it) and checks the handle and the
// op against it.
//
// The op keeps the mem link to the owner, when one is up, in o.link: its
// use page is where runCMA marks the copy, so that the owner's Close
// waits for it.
func (m *Manager) cmaCheck(o *opSpec, seen *cmaEntries) error {
	o.link = m.checksLink(o) // releaseOps drops it
	var entry [guardEntrySize]byte
	if err := m.readEntry(o, seen, &entry, o.link); err != nil {
		return err
	}
	return checkEntry(entry[:], &o.remote, o.ep, need(o.op), true) // process_vm_* takes virtual addresses
}

// shmCheckDirect is the handle check of an op on the shm route, done in
// the calling goroutine when shm itself would read the guard entry with
// process_vm_readv from this process (libfabric.SingleCopy: libfabric
// 1.x, the owner reached): the same read of the same entry, without a job
// through the endpoint's progress loop — on libfabric 1.x a passive loop,
// so the job cost two goroutine hand-offs, about as much as the op. The
// check itself is checkEntry, as over shm, and runs before every op: it
// is what finds a closed or re-registered buffer (a new generation in
// the owner's table), so no entry is ever taken as known from an earlier
// op. It reports false, leaving the check to verifyGuards, where that
// read is not shm's own, and when the read fails or the entry is not in
// the verified owner's table (its process exited and the pid was reused):
// the read over shm then fails as it always did.
func (m *Manager) shmCheckDirect(o *opSpec, seen *cmaEntries) (bool, error) {
	if !m.shmCopiesItself(o) {
		return false, nil
	}
	if err := o.b.BlockedOrGone(progress.Read, o.ep.name); err != nil {
		return true, err // as verifyPeerGuards, before its read
	}
	link := m.checksLink(o)
	if link != nil {
		defer link.drop()
	}
	var entry [guardEntrySize]byte
	if m.readEntry(o, seen, &entry, link) != nil || binary.LittleEndian.Uint64(entry[8*gwTable:]) != o.peer.cma.key {
		return false, nil
	}
	return true, checkEntry(entry[:], &o.remote, o.ep, need(o.op), o.b.VirtAddr)
}

// shmCopiesItself reports whether shm copies the bytes of op o, on the
// shm route, with process_vm_readv/writev from this process (libfabric
// 1.x's single copy, the owner reached): the op then needs no progress of
// the owner, and no wake (wakeOwner).
func (m *Manager) shmCopiesItself(o *opSpec) bool { return m.singleCopyTo(o.peer) }

// singleCopyTo reports whether this process's shm copies the bytes of
// ops toward peer itself (shmCopiesItself).
func (m *Manager) singleCopyTo(peer *sameNodePeer) bool {
	return m.guardDirect && m.reach.Reaches(peer.pid, peer.cma.table)
}

// markShmPart marks the part of op o that x carries in the use page of
// l, the mem link to the owner that x holds, so that the owner's Close
// waits for it before it closes the registration. On libfabric 1.x's
// single-copy path this process copies inside fi_read and fi_write, and
// the owner's provider checks no key. Otherwise the owner's provider
// copies, but a chunk it moves through its bounce buffers in several
// rounds (SAR: every read and every delivery-complete write where CMA
// does not serve the two) goes on being copied after the registration
// closed (smr_progress_sar_list, v1.17.0 and v2.1.0). Marked first, then
// the generation looked at, as a cma op (cma.Mark): a part of a buffer
// closed since the check posts nothing, nor does one whose link ended
// (the owner may no longer count its page). x keeps the mark until the
// loop is done with its job (libfabric.Xfer.HoldUse): for an
// Action.InjectComplete write of at most libfabric.ShmInlineMax bytes on
// 2.0 to 2.6 (libfabric.ShmOwnerCopies), once posted; the owner's
// provider copies such a write in the call that looks up its key, so a
// Close that closed the registration first stops it there.
func (m *Manager) markShmPart(x *libfabric.Xfer, o *opSpec, l *memLink) error {
	slot := o.ep.guard.slot
	k := cma.Mark{Use: &l.uses[slot], Ended: &l.done} // checksLink bounded the slot
	switch err := k.Begin(l.genWord(slot), o.ep.guard.gen); {
	case errors.Is(err, cma.ErrUnmarked):
		err := m.linkEndedErr(o.op, o.b.Name(), o.peer, l)
		if gone := peerGoneOf(err); gone != nil {
			gone.Peer = o.b.Addr(o.ep.name) // as the shm route's other errors name it
		}
		return err
	case err != nil:
		return fmt.Errorf("%s: %w: buffer %d was closed by its owner", o.op, ErrStaleHandle, o.remote.id)
	}
	x.HoldUse(l, slot)
	return nil
}

// EndUse ends a mark in l's use page (a libfabric.Use); the hold on l is
// the Xfer's too, dropped after it (Drop).
func (l *memLink) EndUse(slot uint32) { l.uses.Leave(slot) }

// Drop gives back a hold of checksLink's (libfabric.Xfer.WatchGen).
func (l *memLink) Drop() { l.drop() }

// cmaRequest is the cma ops of one request, pooled so that a request of
// small ops allocates nothing.
type cmaRequest struct {
	ops  []cma.Op
	errs []error
	at   []int // the request's index of each op
}

var cmaRequests = sync.Pool{New: func() any { return new(cmaRequest) }}

// runCMA runs the request's ops on the cma route and appends their errors
// to errs; it returns errs and how many ops failed.
//
// An op whose owner's mem link is up (o.link) is marked in that link's
// use page while it copies (cma.Mark), as a mem op is (memCopy): marked
// first, then the generation looked at, so that either the op sees the
// buffer closed, or the owner's Close sees the mark and waits for the
// copy to end. route gave it a link; one that ended since fails it
// (nothing moved), as a mem op's does.
func (m *Manager) runCMA(lim route.Limit, ops []opSpec, errs []error) ([]error, int) {
	if !slices.ContainsFunc(ops, func(o opSpec) bool { return o.kind == route.CMA }) {
		return errs, 0 // no pooled request to take and give back
	}
	rq := cmaRequests.Get().(*cmaRequest)
	defer func() {
		clear(rq.ops)
		clear(rq.errs)
		rq.ops, rq.errs, rq.at = rq.ops[:0], rq.errs[:0], rq.at[:0]
		cmaRequests.Put(rq)
	}()
	unlinked := 0
	for i := range ops {
		o := &ops[i]
		if o.kind != route.CMA {
			continue
		}
		slot := o.ep.guard.slot
		c := cma.Op{Dir: o.op, PID: o.peer.pid,
			Local:  o.local.st.mem[o.local.off : o.local.off+o.remote.n], // host memory: prepare routed device memory elsewhere
			Remote: o.ep.base + o.remote.off,
			// The entry's generation, in the verified owner's table: what
			// its Close changes first (guardTable.revoke).
			GenAt: o.peer.cma.table + uint64(slot)*guardEntrySize + 8*gwGen, Gen: o.ep.guard.gen}
		if l := o.link; l != nil { // checksLink bounded the slot
			c.GenWord = l.genWord(slot)
			c.Mark = cma.Mark{Use: &l.uses[slot], Ended: &l.done}
		} else {
			// The link route required ended since: the owner's Close
			// would not wait for this copy.
			err := m.linkEndedErr(o.op, cma.Name, o.peer, nil)
			o.failed(err)
			errs = append(errs, err)
			unlinked++
			continue
		}
		rq.ops = append(rq.ops, c)
		rq.errs = append(rq.errs, nil)
		rq.at = append(rq.at, i)
	}
	failed := cma.Run(lim, rq.ops, rq.errs) + unlinked
	for k, err := range rq.errs {
		switch o := &ops[rq.at[k]]; {
		case errors.Is(err, cma.ErrClosed):
			err = fmt.Errorf("%w: buffer %d was closed by its owner: %w", ErrStaleHandle, o.remote.id, err)
		case errors.Is(err, cma.ErrUnmarked):
			err = m.linkEndedErr(o.op, cma.Name, o.peer, o.link)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs, failed
}
