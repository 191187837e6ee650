package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/internal/lifeline"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// The shm guard. libfabric 1.17's shm provider does single-copy RMA with
// process_vm_readv/writev from the initiator when it can ("fast RMA",
// smr_fast_rma_enabled in prov/shm/src/smr.h): the owner is not involved
// and the memory key is never checked, so a stale or altered handle would
// read or write whatever lies at its address. Where the owner does check
// (smr_progress_cmd_rma), a bad key is dropped without an answer and the
// initiator's queue to that peer stays blocked for good.
//
// So the owner publishes the state of each of its buffers in a guard
// table (one 64-byte entry per buffer; registered for remote read on shm),
// the handle names the buffer's entry, and before each transfer the
// initiator reads the entry — over shm, or with process_vm_readv for the
// cma path (cma.go) — and checks generation, key, range and access. A
// closed buffer's entry has a new generation, so its handles fail.

const (
	guardEntrySize = 64
	guardSlots     = 1 << 16 // entries per table (4 MiB of address space)
	scratchSlots   = 256
)

// guard entry words
const (
	gwGen    = iota // generation: a handle's must equal it
	gwKey           // the buffer's shm memory key (0 without shm)
	gwBase          // the buffer's virtual address
	gwSize          // its length
	gwAccess        // mr.Access
	gwID            // buffer id
	gwCMAKey        // the buffer's cma key (random)
	gwTable         // the table's id (random): tells this table from any other memory
)

// guardTable is a manager's table of its buffers' state.
type guardTable struct {
	mem   []byte
	words []uint64 // mem, word by word
	// gens holds each slot's generation alone: what the mem route's
	// peers map (read-only). The table itself holds every buffer's keys,
	// which a peer must learn only from the handles it was given.
	gens    []byte
	genWord []uint64
	// life is the lifeline mem peers read in gens after the generations
	// (lifeOffset): that this process lives, without a system call per
	// op; nil when gens is not published or the lifeline failed.
	life *lifeline.Line
	id   uint64 // random; in every entry
	base uint64 // the table's virtual address
	mu   sync.Mutex
	free []uint32
	next uint32
}

func newGuardTable() (*guardTable, error) {
	mem, err := mr.Alloc(guardSlots * guardEntrySize)
	if err != nil {
		return nil, err
	}
	published := true
	gens, err := mr.AllocPublished(lifeOffset + lifeline.Size)
	if err != nil {
		// A kernel without F_SEAL_FUTURE_WRITE (before 5.1): still a
		// file for the links, which every same-node route needs; peers
		// get it read-only.
		gens, err = mr.AllocControl(lifeOffset + lifeline.Size)
	}
	if err != nil {
		published = false
		gens, err = mr.Alloc(guardSlots * 8) // no memfds here: no links, no same-node route
	}
	if err != nil {
		_ = mr.Free(mem)
		return nil, err
	}
	g := &guardTable{mem: mem, words: mr.Words64(mem), gens: gens, genWord: mr.Words64(gens[:guardSlots*8]),
		id: mr.RandomKey(8), base: uint64(mr.Addr(mem))}
	if published {
		// Without it, peers ask the kernel at every op (a pidfd poll).
		g.life, _ = lifeline.Hold(gens[lifeOffset:])
	}
	return g, nil
}

// lifeOffset is where the lifeline sits in the published generations:
// after them.
const lifeOffset = guardSlots * 8

func (g *guardTable) word(slot uint32, w int) *uint64 {
	return &g.words[int(slot)*guardEntrySize/8+w]
}

// publish fills a free entry for a buffer and returns its slot and
// generation.
func (g *guardTable) publish(id uint64, base, size, shmKey, cmaKey uint64, access mr.Access) (uint32, uint64, error) {
	g.mu.Lock()
	var slot uint32
	switch {
	case len(g.free) > 0:
		slot = g.free[len(g.free)-1]
		g.free = g.free[:len(g.free)-1]
	case g.next < guardSlots:
		slot = g.next
		g.next++
	default:
		g.mu.Unlock()
		return 0, 0, fmt.Errorf("more than %d buffers registered at once", guardSlots)
	}
	g.mu.Unlock()
	gen := atomic.LoadUint64(g.word(slot, gwGen)) + 1
	atomic.StoreUint64(g.word(slot, gwKey), shmKey)
	atomic.StoreUint64(g.word(slot, gwCMAKey), cmaKey)
	atomic.StoreUint64(g.word(slot, gwTable), g.id)
	atomic.StoreUint64(g.word(slot, gwBase), base)
	atomic.StoreUint64(g.word(slot, gwSize), size)
	atomic.StoreUint64(g.word(slot, gwAccess), uint64(access))
	atomic.StoreUint64(g.word(slot, gwID), id)
	atomic.StoreUint64(g.word(slot, gwGen), gen) // last: the entry is valid
	atomic.StoreUint64(&g.genWord[slot], gen)
	return slot, gen, nil
}

// revoke invalidates an entry: handles naming it fail from now on. The
// slot is not reused until release: peers' marks on it (the mem route)
// may still be the closed buffer's. The published generation moves last,
// after the entry is emptied: a peer keeps an entry it read only while
// that generation stood before and after its read (entryCache), so it
// never keeps the revoked generation with the closed buffer's words.
// (Generations alternate: odd while a buffer holds the slot, even once
// revoked.)
func (g *guardTable) revoke(slot uint32) {
	gen := atomic.LoadUint64(g.word(slot, gwGen)) + 1
	atomic.StoreUint64(g.word(slot, gwGen), gen)
	atomic.StoreUint64(g.word(slot, gwKey), 0)
	atomic.StoreUint64(g.word(slot, gwCMAKey), 0)
	atomic.StoreUint64(g.word(slot, gwSize), 0)
	atomic.StoreUint64(g.word(slot, gwAccess), 0)
	atomic.StoreUint64(&g.genWord[slot], gen)
}

// release makes a revoked slot free for another buffer.
func (g *guardTable) release(slot uint32) {
	g.mu.Lock()
	g.free = append(g.free, slot)
	g.mu.Unlock()
}

// gen is slot's generation now.
func (g *guardTable) gen(slot uint32) uint64 { return atomic.LoadUint64(g.word(slot, gwGen)) }

// entryWord is word w of slot's entry now.
func (g *guardTable) entryWord(slot uint32, w int) uint64 { return atomic.LoadUint64(g.word(slot, w)) }

// checkEntry compares a guard entry, as read from the owner, with what a
// handle claims and what the op needs. On the cma path the entry must also
// name the handle's table (cma has no memory keys of its own).
func checkEntry(entry []byte, r *RemoteBuffer, ep *remoteEP, need mr.Access, virtAddr bool) error {
	w := func(i int) uint64 { return binary.LittleEndian.Uint64(entry[8*i:]) }
	key := w(gwKey)
	// The entry holds the buffer's virtual address; an endpoint without
	// FI_MR_VIRT_ADDR advertises offset 0 instead (mr.RemoteAddr).
	base := mr.RemoteAddr(virtAddr, uintptr(w(gwBase)), 0)
	if ep.provider == cma.Name || ep.provider == mem.Name {
		if w(gwTable) != ep.guard.key { // matchesPeer made it the verified owner's table id
			return fmt.Errorf("%w: no guard table of buffer %d's owner at the handle's address (the owner exited?)", ErrStaleHandle, r.id)
		}
		key = w(gwCMAKey)
	}
	switch {
	case w(gwGen) != ep.guard.gen || w(gwID) != r.id:
		return fmt.Errorf("%w: the owner no longer has buffer %d (closed, or the handle is from an earlier registration)", ErrStaleHandle, r.id)
	case key != ep.key || base != ep.base:
		return fmt.Errorf("%w: key or address of buffer %d do not match what its owner registered", ErrStaleHandle, r.id)
	case w(gwSize) != r.size && r.off+r.n > w(gwSize):
		return fmt.Errorf("%w: the handle's range [%d, %d) lies outside the %d bytes its owner registered as buffer %d (the handle was altered)",
			ErrOutOfRange, r.off, r.off+r.n, w(gwSize), r.id)
	case w(gwSize) != r.size:
		return fmt.Errorf("%w: size of buffer %d does not match what its owner registered", ErrStaleHandle, r.id)
	case !mr.Access(w(gwAccess)).Allows(need):
		return fmt.Errorf("%w: the owner registered buffer %d as %s, the op needs %s", ErrAccessDenied, r.id, mr.Access(w(gwAccess)), need)
	}
	return nil
}

// guardCheck is one handle to check before a transfer: the op at index
// op of the request. entry is the index of its guard entry among those
// read for its peer (ops on the same buffer share one read). link, when
// set, keeps the entry read, which the owner published at generation
// before (memLink.keep).
type guardCheck struct {
	op     int
	entry  int
	err    error
	link   *memLink
	before uint64
}

// guardChecks pools the check lists of requests, so that a window of ops
// allocates none.
var guardChecks = sync.Pool{New: func() any {
	s := make([]guardCheck, 0, 64)
	return &s
}}

// verifyGuards reads the guard entries of the ops' handles (one job per
// peer, on the endpoint the ops toward it take) and sets each check's err.
func (m *Manager) verifyGuards(ctx context.Context, start, deadline time.Time, ops []opSpec, checks []guardCheck) error {
	for first := 0; first < len(checks); first++ {
		o := &ops[checks[first].op]
		if first > 0 && checkedPeer(ops, checks[:first], o.b, o.ep.name) {
			continue
		}
		if err := m.verifyPeerGuards(ctx, start, deadline, o.b, ops, checks[first:], o.ep.name); err != nil {
			return err
		}
	}
	return nil
}

// checkedPeer reports whether the checks of the peer name on b were
// already run.
func checkedPeer(ops []opSpec, earlier []guardCheck, b *libfabric.Route, name []byte) bool {
	for _, c := range earlier {
		if o := &ops[c.op]; o.b == b && string(o.ep.name) == string(name) {
			return true
		}
	}
	return false
}

// verifyPeerGuards runs, in one job on b, the checks among checks of the
// handles of the peer name whose ops take b, reading each distinct guard
// entry once.
func (m *Manager) verifyPeerGuards(ctx context.Context, start, deadline time.Time, b *libfabric.Route, ops []opSpec, checks []guardCheck, name []byte) error {
	if err := b.BlockedOrGone(progress.Read, name); err != nil {
		return err
	}
	p, err := b.PeerBy(ctx, deadline, name)
	if err != nil {
		o := &ops[checks[0].op] // the request's op, whose check could not begin
		if te := unstarted(err, o.op, b.Addr(name), o.remote.n, start); te != nil {
			return te
		}
		if gone := goneFor(err, o.op); gone != nil {
			return gone
		}
		return err
	}
	x := b.NewXfer(nil)
	now := time.Now()
	x.Aim(p, progress.Read, now, deadline, ops[checks[0].op].peer.pid) // x holds p until its job is idle
	// The waiter's hold; a loop that keeps the job (wedged) keeps its own.
	defer x.Release()
	for i := range checks {
		ep := ops[checks[i].op].ep
		if ops[checks[i].op].b != b || string(ep.name) != string(name) {
			continue
		}
		peer := ops[checks[i].op].peer // the table's place comes from the owner, verified, not from the handle
		remote := peer.shm.table + uint64(ep.guard.slot)*guardEntrySize
		if checks[i].entry, err = x.ReadEntry(ctx, deadline, remote, peer.shm.key); err != nil {
			o := &ops[checks[0].op]
			if te := unstarted(err, o.op, b.Addr(name), o.remote.n, start); te != nil {
				return te
			}
			return err
		}
	}
	ops[checks[0].op].peer.wakeOwner(now) // the read needs the owner's progress
	if err := x.Submit(); err != nil {
		return err
	}
	if err := b.Wait(ctx, x); err != nil {
		var te *progress.TimeoutError
		if errors.As(err, &te) {
			// Left to the loop at the request's end (a call held the
			// endpoint): a handle check that timed out, as one that
			// finished so.
			j := x.Job() // its chunks were set before Submit: not the loop's to write
			return &TransferError{Op: "handle check", Bytes: j.Bytes(), Ops: len(j.Chunks), Chunks: len(j.Chunks), Failed: 1, Errs: []error{err}}
		}
		return err // a wedged loop keeps the job, and its own hold on the scratch it reads into
	}
	j := x.Job()
	if len(j.Errs) > 0 {
		errs := append([]error(nil), j.Errs...)
		m.closedErrs(errs)
		return &TransferError{Op: "handle check", Bytes: j.Bytes(), Ops: len(j.Chunks), Chunks: len(j.Chunks),
			Failed: len(j.Errs), Errs: errs}
	}
	for i := range checks {
		o := &ops[checks[i].op]
		if o.b != b || string(o.ep.name) != string(name) {
			continue
		}
		entry := x.Entry(checks[i].entry)
		checks[i].err = checkEntry(entry, &o.remote, o.ep, need(o.op), b.VirtAddr)
		if c := &checks[i]; c.link != nil {
			c.link.keep(o.ep.guard.slot, (*[guardEntrySize]byte)(entry), c.before)
		}
	}
	return nil
}
