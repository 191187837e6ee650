package libfabric

import (
	"context"
	"fmt"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// Scratch is an shm route's registrations for handle checks: the table
// peers read (the manager's guard table, registered for remote read), and
// the memory this manager reads its peers' entries into, in slots of one
// entry.
type Scratch struct {
	table     *fabric.MR
	tableAt   uintptr // the table's address
	mem       []byte
	mr        *fabric.MR
	slots     chan uint32
	entrySize int
}

// RegisterScratch registers table for remote read on the route and
// allocates n slots of entrySize bytes for reads of peers' entries.
func (r *Route) RegisterScratch(table []byte, entrySize, n int) error {
	smem, err := mr.Alloc(n * entrySize)
	if err != nil {
		return err
	}
	s := &Scratch{tableAt: mr.Addr(table), mem: smem, slots: make(chan uint32, n), entrySize: entrySize}
	for i := uint32(0); i < uint32(n); i++ {
		s.slots <- i
	}
	var terr, serr error
	if err := r.loop.Do(func() {
		ep := r.loop.Endpoint()
		s.table, terr = mr.Register(ep.Target(), mr.HostRegion(table, mr.RemoteRead))
		s.mr, serr = mr.Register(ep.Target(), mr.HostRegion(smem, 0))
	}); err != nil {
		terr = err
	}
	if terr != nil || serr != nil {
		_ = r.loop.Do(s.closeMRs)
		_ = mr.Free(smem)
		if terr == nil {
			terr = serr
		}
		return fmt.Errorf("%s guard table: %w", r.Provider, terr)
	}
	r.Scratch = s
	if r.SelfCheckNeeded() {
		// Now, not in SelfCheck: a check after a death must not wait on
		// Do, which ignores its context, to insert the address.
		if p, err := r.Peer(r.name); err == nil {
			p.Done()
		}
	}
	return nil
}

// TableKey is the key peers read the table with.
func (s *Scratch) TableKey() uint64 { return s.table.Key() }

func (s *Scratch) closeMRs() {
	if s.table != nil {
		_ = s.table.Close()
	}
	if s.mr != nil {
		_ = s.mr.Close()
	}
}

func (s *Scratch) get(ctx context.Context, deadline time.Time) (uint32, error) {
	select {
	case i := <-s.slots:
		return i, nil
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var cause error
	select {
	case i := <-s.slots:
		return i, nil
	case <-ctx.Done():
		cause = ctx.Err()
	case <-t.C:
		cause = context.DeadlineExceeded
	}
	// A timeout of the request, in the vocabulary every route answers
	// with, before anything of it moved; ReadEntry and its caller fill
	// in the op.
	return 0, &progress.TimeoutError{Cause: cause, Awaiting: fmt.Sprintf(
		"a free slot for its handle check (all %d were taken by earlier checks, toward owners that have not answered them)", cap(s.slots))}
}

func (s *Scratch) put(i uint32) { s.slots <- i }

func (s *Scratch) entry(i uint32) []byte {
	return s.mem[int(i)*s.entrySize : int(i+1)*s.entrySize]
}

// ReadEntry adds to x's job a read of one scratch entry's worth of bytes
// at remote (with key) into a scratch slot, unless the job reads that
// entry already, and returns the entry's index in the job. The route must
// have Scratch; x's job must hold only such reads.
func (x *Xfer) ReadEntry(ctx context.Context, deadline time.Time, remote, key uint64) (int, error) {
	j := x.job
	for k := range j.Chunks {
		if j.Chunks[k].Remote == remote && j.Chunks[k].Key == key {
			return k, nil
		}
	}
	s := x.r.Scratch
	slot, err := s.get(ctx, deadline)
	if err != nil {
		if te, ok := err.(*progress.TimeoutError); ok {
			te.Provider = string(x.r.Provider) // the op's other fields are its caller's
		}
		return 0, err
	}
	x.scratch = append(x.scratch, slot)
	j.Chunks = append(j.Chunks, progress.Chunk{
		Local: mr.Addr(s.entry(slot)), Desc: s.mr.Desc(), Len: uint64(s.entrySize),
		Remote: remote, Key: key,
	})
	return len(j.Chunks) - 1, nil
}

// Entry is the bytes ReadEntry's read i brought, once the job completed.
func (x *Xfer) Entry(i int) []byte { return x.r.Scratch.entry(x.scratch[i]) }
