package ofi

/*
#include "ofi.h"

// The data path's calls take their pointers as integers. cgo checks each
// pointer argument of a call for Go pointers (runtime.cgoCheckPointer),
// tens of nanoseconds at a spinning loop's every round; these pointers
// all lead to C memory.
static inline int ft_post_u(uintptr_t ep, uintptr_t ops, int n, uintptr_t ctx, uintptr_t rc)
{
	return ft_post((struct fid_ep *)ep, (const struct ft_op *)ops, n,
		       (struct fi_context2 *)ctx, (ssize_t *)rc);
}

static inline int ft_cq_read_u(uintptr_t cq, uintptr_t ctx, uint32_t nctx, uintptr_t slots, int max)
{
	return ft_cq_read((struct fid_cq *)cq, (const struct fi_context2 *)ctx, nctx,
			  (uint32_t *)slots, max);
}
*/
import "C"

import (
	"unsafe"
)

// Op is one RMA operation to post.
type Op struct {
	Local  uintptr // local buffer address (off the Go heap, or device memory)
	Len    uint64
	Desc   Desc   // fi_mr_desc of the local MR
	Remote uint64 // remote address: virtual address or offset
	Key    uint64 // remote key
	Peer   uint64 // fi_addr_t
	Flags  uint64 // OpFlags: FI_COMPLETION, FI_DELIVERY_COMPLETE...
	Slot   uint32 // context slot; its completion reports this slot
	Write  bool
}

// NoSlot is the slot of a completion error that has no op context.
const NoSlot = ^uint32(0)

// CQError is an error completion, copied out of libfabric at once.
type CQError struct {
	Err         Errno
	ProvErrno   int
	Slot        uint32 // NoSlot when not tied to an op
	Len         uint64
	Flags       uint64
	ProvMessage string // fi_cq_strerror
}

// Queue holds, in C memory, the op array a batch is posted from, the
// fi_context2 slots ops carry (never Go memory: libfabric keeps the
// pointer), and the array completions are reaped into. One goroutine uses a
// Queue.
type Queue struct {
	ops    []C.struct_ft_op
	ctx    *C.struct_fi_context2
	nslots int
	slots  []uint32
	err    *C.struct_ft_cq_err
	rc     *C.ssize_t
}

var errPostAgain = &CallError{Call: "fi_readmsg/fi_writemsg", Errno: ErrAgain}

// reapMax is how many completions one Reap reads at most.
const reapMax = 64

// NewQueue allocates a queue posting up to batch ops per call, with nslots
// op contexts.
func NewQueue(batch, nslots int) *Queue {
	q := &Queue{nslots: nslots}
	q.ops = unsafe.Slice((*C.struct_ft_op)(C.calloc(C.size_t(batch), C.sizeof_struct_ft_op)), batch)
	q.ctx = (*C.struct_fi_context2)(C.calloc(C.size_t(nslots), C.sizeof_struct_fi_context2))
	q.slots = unsafe.Slice((*uint32)(C.calloc(reapMax, 4)), reapMax)
	q.err = (*C.struct_ft_cq_err)(C.calloc(1, C.sizeof_struct_ft_cq_err))
	q.rc = (*C.ssize_t)(C.calloc(1, C.sizeof_ssize_t))
	return q
}

// Batch is how many ops one Post takes at most.
func (q *Queue) Batch() int { return len(q.ops) }

// Slots is the number of op contexts.
func (q *Queue) Slots() int { return q.nslots }

// Set writes op i of the next batch.
func (q *Queue) Set(i int, op *Op) {
	c := &q.ops[i]
	c.local = C.uint64_t(op.Local)
	c.len = C.uint64_t(op.Len)
	c.desc = unsafe.Pointer(op.Desc)
	c.remote = C.uint64_t(op.Remote)
	c.key = C.uint64_t(op.Key)
	c.peer = C.uint64_t(op.Peer)
	c.flags = C.uint64_t(op.Flags)
	c.slot = C.uint32_t(op.Slot)
	c.write = 0
	if op.Write {
		c.write = 1
	}
}

// Post posts ops 0..n of the batch in one call. It returns how many were
// posted; when fewer than n, err says why (errors.Is(err, ErrAgain): the
// provider is out of resources — progress the CQ and retry the rest).
func (q *Queue) Post(ep *Endpoint, n int) (int, error) {
	if n == 0 {
		return 0, nil
	}
	posted := int(C.ft_post_u(cptr(unsafe.Pointer(ep.e.ep)), cptr(unsafe.Pointer(&q.ops[0])), C.int(n),
		cptr(unsafe.Pointer(q.ctx)), cptr(unsafe.Pointer(q.rc))))
	if posted < n {
		if *q.rc == -C.FI_EAGAIN {
			return posted, errPostAgain // the common case: no allocation
		}
		return posted, checkSize("fi_readmsg/fi_writemsg", *q.rc)
	}
	return posted, nil
}

// Reap reads up to 64 completions and returns their slots (valid until
// the next Reap); errors.Is(err, ErrAvail) means an error entry waits
// (ReadErr). Reading also drives the provider's progress.
func (q *Queue) Reap(ep *Endpoint) ([]uint32, error) {
	n := C.ft_cq_read_u(cptr(unsafe.Pointer(ep.e.cq)), cptr(unsafe.Pointer(q.ctx)), C.uint32_t(q.nslots),
		cptr(unsafe.Pointer(&q.slots[0])), reapMax)
	if n < 0 {
		return nil, check("fi_cq_read", n)
	}
	return q.slots[:n], nil
}

// ReadErr reads one error completion; ok is false when none was waiting.
func (q *Queue) ReadErr(ep *Endpoint) (e CQError, ok bool, err error) {
	rc := C.ft_cq_readerr(ep.e.cq, q.ctx, C.uint32_t(q.nslots), q.err)
	if rc < 0 {
		return e, false, check("fi_cq_readerr", rc)
	}
	if rc == 0 {
		return e, false, nil
	}
	c := q.err
	return CQError{
		Err: Errno(c.err), ProvErrno: int(c.prov_errno), Slot: uint32(c.slot),
		Len: uint64(c.len), Flags: uint64(c.flags), ProvMessage: C.GoString(&c.msg[0]),
	}, true, nil
}

// cptr passes a pointer to C memory to C as an integer (see the
// preamble: no cgo pointer check).
func cptr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

// Free releases the queue's C memory. Only after the endpoint it posted to
// is closed: libfabric may still hold pointers into the contexts.
func (q *Queue) Free() {
	if q == nil || q.ctx == nil {
		return
	}
	C.free(unsafe.Pointer(&q.ops[0]))
	C.free(unsafe.Pointer(q.ctx))
	C.free(unsafe.Pointer(&q.slots[0]))
	C.free(unsafe.Pointer(q.err))
	C.free(unsafe.Pointer(q.rc))
	q.ctx = nil
}
