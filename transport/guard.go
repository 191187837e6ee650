package transport

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/internal/ofi"
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
	id    uint64   // random; in every entry
	base  uint64   // the table's virtual address
	mu    sync.Mutex
	free  []uint32
	next  uint32
}

func newGuardTable() (*guardTable, error) {
	mem, err := mr.Alloc(guardSlots * guardEntrySize)
	if err != nil {
		return nil, err
	}
	return &guardTable{mem: mem, words: mr.Words64(mem), id: mr.RandomKey(8), base: uint64(mr.Addr(mem))}, nil
}

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
	return slot, gen, nil
}

// revoke invalidates an entry: handles naming it fail from now on.
func (g *guardTable) revoke(slot uint32) {
	atomic.StoreUint64(g.word(slot, gwGen), atomic.LoadUint64(g.word(slot, gwGen))+1)
	atomic.StoreUint64(g.word(slot, gwKey), 0)
	atomic.StoreUint64(g.word(slot, gwCMAKey), 0)
	atomic.StoreUint64(g.word(slot, gwSize), 0)
	atomic.StoreUint64(g.word(slot, gwAccess), 0)
	g.mu.Lock()
	g.free = append(g.free, slot)
	g.mu.Unlock()
}

// scratchPool is an shm backend's registrations for handle checks: the
// guard table, for peers to read, and the memory where this manager reads
// its peers' entries to.
type scratchPool struct {
	table *ofi.MR // the guard table's registration on the backend
	mem   []byte
	mr    *ofi.MR
	slots chan uint32
}

func (s *scratchPool) get(ctx context.Context, deadline time.Time) (uint32, error) {
	select {
	case i := <-s.slots:
		return i, nil
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case i := <-s.slots:
		return i, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-t.C:
		return 0, fmt.Errorf("handle check: %w: all %d scratch slots stayed busy until the deadline", context.DeadlineExceeded, scratchSlots)
	}
}

func (s *scratchPool) put(i uint32) { s.slots <- i }

func (s *scratchPool) entry(i uint32) []byte {
	return s.mem[int(i)*guardEntrySize : int(i+1)*guardEntrySize]
}

// registerGuard registers the table for remote read on the shm backend
// and allocates the scratch space shm handle checks land in.
func registerGuard(g *guardTable, b *backend) (*scratchPool, error) {
	smem, err := mr.Alloc(scratchSlots * guardEntrySize)
	if err != nil {
		return nil, err
	}
	s := &scratchPool{mem: smem, slots: make(chan uint32, scratchSlots)}
	for i := uint32(0); i < scratchSlots; i++ {
		s.slots <- i
	}
	var gerr, serr error
	if err := b.loop.Do(func() {
		ep := b.loop.Endpoint()
		s.table, gerr = mr.Register(ep.Target(), mr.HostRegion(g.mem, mr.RemoteRead))
		s.mr, serr = mr.Register(ep.Target(), mr.HostRegion(smem, 0))
	}); err != nil {
		gerr = err
	}
	if gerr != nil || serr != nil {
		_ = b.loop.Do(func() { _ = s.table.Close(); _ = s.mr.Close() })
		_ = mr.Free(smem)
		if gerr == nil {
			gerr = serr
		}
		return nil, fmt.Errorf("shm guard table: %w", gerr)
	}
	return s, nil
}

// closeGuardMRs deregisters the table and the scratch space (on the shm
// loop, before its endpoint closes).
func closeGuardMRs(s *scratchPool) {
	_ = s.table.Close()
	_ = s.mr.Close()
}

// checkEntry compares a guard entry, as read from the owner, with what a
// handle claims and what the op needs. On the cma path the entry must also
// name the handle's table (cma has no memory keys of its own).
func checkEntry(entry []byte, r *RemoteBuffer, ep *remoteEP, need mr.Access, virtAddr bool) error {
	w := func(i int) uint64 { return binary.LittleEndian.Uint64(entry[8*i:]) }
	key := w(gwKey)
	// The entry holds the buffer's virtual address; an endpoint without
	// FI_MR_VIRT_ADDR advertises offset 0 instead (mr.RemoteAddr).
	base := mr.RemoteAddr(virtAddr, uintptr(w(gwBase)), 0)
	if ep.provider == cma.Name {
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
// read for its peer (ops on the same buffer share one read).
type guardCheck struct {
	op    int
	entry int
	err   error
}

// guardChecks pools the check lists of requests, so that a window of ops
// allocates none.
var guardChecks = sync.Pool{New: func() any {
	s := make([]guardCheck, 0, 64)
	return &s
}}

// verifyGuards reads the guard entries of the ops' handles (one job per
// peer) and sets each check's err.
func (m *Manager) verifyGuards(ctx context.Context, deadline time.Time, b *backend, ops []opSpec, checks []guardCheck) error {
	for first := 0; first < len(checks); first++ {
		name := ops[checks[first].op].ep.name
		if first > 0 && done(ops, checks[:first], name) {
			continue
		}
		if err := m.verifyPeerGuards(ctx, deadline, b, ops, checks[first:], name); err != nil {
			return err
		}
	}
	return nil
}

// done reports whether the checks of the peer name were already run.
func done(ops []opSpec, earlier []guardCheck, name []byte) bool {
	for _, c := range earlier {
		if string(ops[c.op].ep.name) == string(name) {
			return true
		}
	}
	return false
}

// verifyPeerGuards runs, in one job, the checks of the handles of one
// peer among checks, reading each distinct guard entry once.
func (m *Manager) verifyPeerGuards(ctx context.Context, deadline time.Time, b *backend, ops []opSpec, checks []guardCheck, name []byte) error {
	if err := b.blockedOrGone(progress.Read, name); err != nil {
		return err
	}
	p, err := b.peer(name)
	if err != nil {
		return err
	}
	x := m.newXfer(b)
	x.peer = p // held until the job is idle
	release := true
	defer func() {
		if release {
			x.release()
		}
	}()
	j := x.job
	j.Op, j.Peer, j.PeerName, j.Start, j.Deadline = progress.Read, p.addr, p.name, time.Now(), deadline
	x.pid, j.Check = ops[checks[0].op].peer.pid, peerAlive
	for i := range checks {
		ep := ops[checks[i].op].ep
		if string(ep.name) != string(name) {
			continue
		}
		peer := ops[checks[i].op].peer // the table's place comes from the owner, verified, not from the handle
		remote := peer.shm.table + uint64(ep.guard.slot)*guardEntrySize
		checks[i].entry = -1
		for k := range j.Chunks {
			if j.Chunks[k].Remote == remote && j.Chunks[k].Key == peer.shm.key {
				checks[i].entry = k
				break
			}
		}
		if checks[i].entry >= 0 {
			continue
		}
		s, err := b.scratch.get(ctx, deadline)
		if err != nil {
			return err
		}
		x.scratch = append(x.scratch, s)
		entry := b.scratch.entry(s)
		checks[i].entry = len(j.Chunks)
		j.Chunks = append(j.Chunks, progress.Chunk{
			Local: mr.Addr(entry), Desc: b.scratch.mr.Desc(), Len: guardEntrySize,
			Remote: remote, Key: peer.shm.key,
		})
	}
	if err := x.submit(); err != nil {
		return err
	}
	if err := b.loop.Wait(ctx, j); err != nil {
		release = false // the wedged loop keeps the job and the scratch it reads into
		return err
	}
	if len(j.Errs) > 0 {
		return &TransferError{Op: "handle check", Bytes: j.Bytes(), Ops: len(j.Chunks), Chunks: len(j.Chunks),
			Failed: len(j.Errs), Errs: append([]error(nil), j.Errs...)}
	}
	for i := range checks {
		o := &ops[checks[i].op]
		if string(o.ep.name) != string(name) {
			continue
		}
		checks[i].err = checkEntry(b.scratch.entry(x.scratch[checks[i].entry]), &o.remote, o.ep, need(o.op), b.virtAddr)
	}
	return nil
}
