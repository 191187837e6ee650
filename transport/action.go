package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/fitransfer/fitransfer/progress"
)

// Action is a batch of reads and writes submitted together: all of them
// are checked before any is posted, then they run in parallel (in no
// particular order) and Submit waits for all. Ops of one Action must not
// touch overlapping local memory where one of them writes it (a read into
// it); Submit refuses such an Action with ErrConflict. An Action is not
// safe for concurrent use; Submit may be called again.
type Action struct {
	m          *Manager
	ops        []opReq
	run        []opSpec // what Submit executes (execute changes its ops)
	err        error
	overlap    bool
	sourceFree bool
}

// opReq is an op as added: what Submit's execution state (opSpec) starts
// from. It is small because a single-op action, reset and refilled for
// every op, writes it twice an op.
type opReq struct {
	op     progress.Op
	local  view
	remote RemoteBuffer
}

// NewAction starts an empty batch.
func (m *Manager) NewAction() *Action { return &Action{m: m} }

// ReadInto adds a read of src into dst (as Manager.ReadInto).
func (a *Action) ReadInto(dst *Buffer, src RemoteBuffer) *Action {
	switch {
	case dst == nil:
		a.fail(errors.New("ReadInto: nil destination buffer"))
	case dst.Len() < src.Len():
		a.fail(fmt.Errorf("%w: op %d reads %d bytes into a %d-byte buffer", ErrTooSmall, len(a.ops), src.Len(), dst.Len()))
	default:
		a.ops = append(a.ops, opReq{op: progress.Read, local: view{dst.st, dst.off, src.Len()}, remote: src})
	}
	return a
}

// WriteFrom adds a write of src into dst (as Manager.WriteFrom).
func (a *Action) WriteFrom(dst RemoteBuffer, src *Buffer) *Action {
	switch {
	case src == nil:
		a.fail(errors.New("WriteFrom: nil source buffer"))
	case src.Len() > dst.Len():
		a.fail(fmt.Errorf("%w: op %d writes %d bytes into a %d-byte remote buffer", ErrTooSmall, len(a.ops), src.Len(), dst.Len()))
	default:
		dst.n = src.n // the first src.Len() bytes: the op's length is its remote view's
		a.ops = append(a.ops, opReq{op: progress.Write, local: view{src.st, src.off, src.n}, remote: dst})
	}
	return a
}

func (a *Action) fail(err error) {
	if a.err == nil {
		a.err = err
	}
}

// AllowOverlap lets ops of this action read into overlapping local memory,
// whose content is then undefined: for benchmarks that, like fabtests,
// point every op of a window at the same buffer and do not look at the
// data. It survives Reset.
func (a *Action) AllowOverlap() *Action {
	a.overlap = true
	return a
}

// InjectComplete lets this action's writes complete as soon as their
// local bytes may be reused (FI_INJECT_COMPLETE), before the target has
// them: a nil error from Submit then says nothing of the target's memory.
// A write the owner refuses (a closed buffer), or that a lost connection
// takes with it (the owner's death, a link down), is not reported to it,
// and a rail that stops carrying data goes unnoticed through such writes.
// Over tcp;ofi_rxm a refusal drops the connection: ops to that owner
// begun after the write completed that fail on it are posted again, one
// at a time and a millisecond apart, for up to 100 ms, until rxm has
// connected anew; an action of many such ops may fail in part, retryable
// (docs/RELIABILITY.md).
// Over libfabric 2.0 to 2.6's shm, a write of at most 192 bytes of host
// memory (what shm carries inside its command) completes once posted,
// before the owner's provider copies it; that copy looks up the key, so
// such a write never lands once the owner's Close has returned, and a
// refused one is dropped.
// It is for protocols in which the target answers each write, such as a
// pingpong, where waiting for the write's own completion costs a message:
// over tcp;ofi_rxm the owner acknowledges every write that asks for
// transmit or delivery completion, and on 2.x's shm such a write waits for
// the owner's answer (2.1 moves it through shm's bounce buffers). Other
// writes complete as without it.
// It survives Reset.
func (a *Action) InjectComplete() *Action {
	a.sourceFree = true
	return a
}

// Reset empties the action for reuse, keeping its memory.
func (a *Action) Reset() {
	clear(a.ops)
	a.ops, a.err = a.ops[:0], nil
}

// Len is the number of ops added.
func (a *Action) Len() int { return len(a.ops) }

// Submit runs every op and waits for all of them. It fails before moving
// anything when an op was invalid, when ops conflict, or when a handle is
// refused; otherwise a *TransferError keeps the error of every failed op.
func (a *Action) Submit(ctx context.Context) error {
	if ctx == nil {
		return nilContext("Action.Submit")
	}
	if a.err != nil {
		return a.err
	}
	if len(a.ops) == 0 {
		return nil
	}
	if len(a.ops) == 1 {
		// As Manager.ReadInto and WriteFrom: one op takes the handle's
		// remembered mem route when it still holds.
		o := &a.ops[0]
		if done, err := a.m.memFast(ctx, "action", o.op, o.local, &o.remote); done {
			return err
		}
	} else if !a.overlap {
		if err := conflicts(a.ops); err != nil {
			return err
		}
	}
	a.run = a.run[:0]
	for _, o := range a.ops {
		a.run = append(a.run, opSpec{op: o.op, local: o.local, remote: o.remote, sourceFree: a.sourceFree})
	}
	err := a.m.run(ctx, "action", a.run)
	clear(a.run)
	return err
}

// conflicts finds two ops whose local ranges overlap where one of them
// writes local memory (a read into it).
func conflicts(ops []opReq) error {
	type rng struct {
		st       *bufState
		off, end uint64
		read     bool
		op       int
	}
	rs := make([]rng, 0, len(ops))
	for i, o := range ops {
		if o.local.n == 0 {
			continue
		}
		rs = append(rs, rng{o.local.st, o.local.off, o.local.off + o.local.n, o.op == progress.Read, i})
	}
	sort.Slice(rs, func(i, j int) bool {
		if a, b := rs[i].st, rs[j].st; a != b {
			// Any total order of buffers will do: ids are unique within
			// a manager, and an action may name another's (refused later).
			if a.id != b.id {
				return a.id < b.id
			}
			return bytes.Compare(a.m.id[:], b.m.id[:]) < 0
		}
		return rs[i].off < rs[j].off
	})
	var endAll, endRead uint64
	var opAll, opRead int
	for i, r := range rs {
		if i == 0 || r.st != rs[i-1].st {
			endAll, endRead = 0, 0
		}
		switch {
		case r.read && r.off < endAll:
			return fmt.Errorf("%w: op %d reads into local bytes [%d, %d) that op %d also uses", ErrConflict, r.op, r.off, r.end, opAll)
		case !r.read && r.off < endRead:
			return fmt.Errorf("%w: op %d writes from local bytes [%d, %d) that op %d reads into", ErrConflict, r.op, r.off, r.end, opRead)
		}
		if r.end > endAll {
			endAll, opAll = r.end, r.op
		}
		if r.read && r.end > endRead {
			endRead, opRead = r.end, r.op
		}
	}
	return nil
}
