package transport

import (
	"sync"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/mem"
)

// CMAError is a failed copy on the cma route (process_vm_readv/writev):
// the errno, and which bytes of which op.
type CMAError = cma.Error

// CMAAvailable reports whether managers of this process move same-node
// bytes themselves with process_vm_readv/writev (the cma route), and why
// not when they do not.
func CMAAvailable() (bool, string) { return cma.Available() }

// MemAvailable reports whether managers of this process use the mem
// route (FITRANSFER_MEM is not 0), and why not when they do not.
func MemAvailable() (bool, string) {
	if !mem.Enabled() {
		return false, mem.Env + "=0 switches the mem route off"
	}
	return true, ""
}

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

// cmaCheck reads the buffer's guard entry from its owner (or takes it from
// seen, when this request already read it) and checks the handle and the
// op against it.
func cmaCheck(o *opSpec, seen *cmaEntries) error {
	pid := o.peer.pid
	addr := o.peer.cma.table + uint64(o.ep.guard.slot)*guardEntrySize
	for i := 0; i < seen.n; i++ {
		if seen.keys[i].pid == pid && seen.keys[i].addr == addr {
			return checkEntry(seen.entries[i][:], &o.remote, o.ep, need(o.op), true)
		}
	}
	var entry [guardEntrySize]byte
	if err := cma.ReadAt(o.op, pid, addr, entry[:], o.remote.n); err != nil {
		return err
	}
	if seen.n < len(seen.keys) {
		seen.keys[seen.n].pid, seen.keys[seen.n].addr = pid, addr
		seen.entries[seen.n] = entry
		seen.n++
	}
	return checkEntry(entry[:], &o.remote, o.ep, need(o.op), true) // process_vm_* takes virtual addresses
}

// cmaRequest is the cma ops of one request, pooled so that a request of
// small ops allocates nothing.
type cmaRequest struct {
	ops  []cma.Op
	errs []error
}

var cmaRequests = sync.Pool{New: func() any { return new(cmaRequest) }}

// runCMA runs the request's ops on the cma route and appends their errors
// to errs; it returns errs and how many ops failed.
func runCMA(lim route.Limit, ops []opSpec, errs []error) ([]error, int) {
	rq := cmaRequests.Get().(*cmaRequest)
	defer func() {
		clear(rq.ops)
		clear(rq.errs)
		rq.ops, rq.errs = rq.ops[:0], rq.errs[:0]
		cmaRequests.Put(rq)
	}()
	for i := range ops {
		o := &ops[i]
		if o.kind != route.CMA {
			continue
		}
		rq.ops = append(rq.ops, cma.Op{Dir: o.op, PID: o.peer.pid,
			Local:  o.local.st.mem[o.local.off : o.local.off+o.remote.n], // host memory: prepare routed device memory elsewhere
			Remote: o.ep.base + o.remote.off})
		rq.errs = append(rq.errs, nil)
	}
	if len(rq.ops) == 0 {
		return errs, 0
	}
	failed := cma.Run(lim, rq.ops, rq.errs)
	for _, err := range rq.errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs, failed
}
