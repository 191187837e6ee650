package transport

import (
	"errors"
	"fmt"
	"github.com/fitransfer/fitransfer/internal/proc"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/progress"
)

// The cma path: same-node transfers done by fitransfer itself with
// process_vm_readv / process_vm_writev.
//
// libfabric's shm can leave one process deaf for good when another dies at
// the wrong moment:
//
//   - 1.x, single-copy ("fast RMA") path: the initiator holds the target's
//     region spin lock while it copies (prov/shm/src/smr_rma.c,
//     smr_generic_rma, v1.17.0). An initiator killed inside that section
//     leaves the lock held: the target's next progress call, and every
//     other initiator's next op to it, spin forever.
//   - 2.x, the same path: the initiator claims a slot of the target's
//     command queue, copies, then commits the slot (smr_rma_fast, v2.1.0).
//     An initiator killed mid-copy leaves a slot that is never committed,
//     and the target never reads its queue again.
//   - Both, the path where the target copies (fitransfer asks 2.x for it,
//     fabric.WithoutShmFastRMA): the initiator takes its completions from
//     a queue in order (smr_progress_resp), so an op whose target died
//     never completes, and neither does any later op on that endpoint.
//
// All three were seen here with SIGKILL during 64 MiB transfers. So when
// process_vm_readv reaches the peer, fitransfer copies the bytes itself —
// the same single copy shm would do, without shared state, without the
// owner's progress and without shm's per-op notification. The owner's
// guard table (guard.go) is read the same way before each transfer. The
// copy is synchronous: when it returns, the bytes are in the destination
// process's memory, so a write is delivery-complete. Peers it does not
// reach (another pid namespace, ptrace restrictions) and device memory go
// over shm.

const (
	cmaProvider = "cma"
	cmaChunk    = copyPiece // bytes per system call, so that the deadline is checked in between
	cmaSmall    = 1 << 20   // ops up to this size share system calls
)

var cmaPath struct {
	once sync.Once
	ok   bool
	why  string
}

// cmaAvailable reports whether this process uses the cma path, and why
// not when it does not.
func cmaAvailable() (bool, string) {
	cmaPath.once.Do(func() {
		scope := yamaPtraceScope()
		switch {
		case os.Getenv("FITRANSFER_CMA") == "0":
			cmaPath.why = "disabled by FITRANSFER_CMA=0"
		case scope != "" && scope != "0":
			cmaPath.why = "yama ptrace_scope=" + scope + " restricts process_vm_readv"
		default:
			cmaPath.ok = true
		}
	})
	return cmaPath.ok, cmaPath.why
}

// yamaPtraceScope is the yama LSM's ptrace_scope ("" without yama): above
// 0 it restricts process_vm_readv/writev to descendants or less.
func yamaPtraceScope() string { return readTrimmed("/proc/sys/kernel/yama/ptrace_scope") }

func cmaName(pid int) []byte { return []byte(strconv.Itoa(pid)) }

func cmaPID(name []byte) int {
	pid, err := strconv.Atoi(string(name))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// cmaReach says, per peer process, whether process_vm_readv reaches it.
type cmaReach struct {
	mu   sync.Mutex
	seen map[int]bool
}

// reaches probes pid once (cmaReaches) and remembers.
func (c *cmaReach) reaches(pid int, addr uint64) bool {
	c.mu.Lock()
	ok, known := c.seen[pid]
	c.mu.Unlock()
	if known {
		return ok
	}
	ok = cmaReaches(pid, addr)
	c.mu.Lock()
	if c.seen == nil {
		c.seen = map[int]bool{}
	}
	c.seen[pid] = ok
	c.mu.Unlock()
	return ok
}

// CMAError is a failed cma copy.
type CMAError struct {
	Op     progress.Op
	Peer   string
	Offset uint64
	Len    uint64
	Errno  syscall.Errno
}

func (e *CMAError) Error() string {
	hint := ""
	switch e.Errno {
	case unix.EFAULT:
		hint = ": the owner's memory at the handle's address is not mapped (its buffer was freed while registered)"
	case unix.EPERM:
		hint = ": process_vm_readv/writev is not permitted between these processes (ptrace restrictions)"
	}
	return fmt.Sprintf("%s of %d bytes at offset %d with %s over cma failed: %v%s", e.Op, e.Len, e.Offset, e.Peer, e.Errno, hint)
}

// Unwrap exposes the errno.
func (e *CMAError) Unwrap() error { return e.Errno }

// cmaPeer is how errors name a cma peer.
func cmaPeer(pid int) string { return "process " + strconv.Itoa(pid) }

// cmaError turns a system call error into the error of the op.
func cmaError(op progress.Op, pid int, off, n uint64, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) && errno == unix.ESRCH {
		// No such process, or one without memory: a zombie (processGone
		// tells which).
		_, why := proc.Gone(pid)
		if why == "" {
			why = "process " + strconv.Itoa(pid) + " no longer exists"
		}
		return &progress.PeerGoneError{Op: op, Provider: cmaProvider, Peer: cmaPeer(pid), Cause: why}
	}
	if errors.As(err, &errno) {
		return &CMAError{Op: op, Peer: cmaPeer(pid), Offset: off, Len: n, Errno: errno}
	}
	return err
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
	n, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &entry[0], Len: guardEntrySize}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: guardEntrySize}}, 0)
	if err != nil {
		return cmaError(o.op, pid, 0, o.remote.n, err)
	}
	if n != guardEntrySize {
		return &CMAError{Op: o.op, Peer: cmaPeer(pid), Len: guardEntrySize, Errno: unix.EFAULT}
	}
	if seen.n < len(seen.keys) {
		seen.keys[seen.n].pid, seen.keys[seen.n].addr = pid, addr
		seen.entries[seen.n] = entry
		seen.n++
	}
	return checkEntry(entry[:], &o.remote, o.ep, need(o.op), true) // process_vm_* takes virtual addresses
}

// cmaBatchMax is how many ops one process_vm_readv/writev call carries
// (IOV_MAX is 1024).
const cmaBatchMax = 256

// cmaBatch is the iovecs of one call, pooled so that a request of small
// ops allocates nothing.
type cmaBatch struct {
	ops  [cmaBatchMax]int // indices into the request's ops
	liov [cmaBatchMax]unix.Iovec
	riov [cmaBatchMax]unix.RemoteIovec
}

var cmaBatches = sync.Pool{New: func() any { return new(cmaBatch) }}

// cmaCopyAll runs the cma ops of a request: small ops to the same process
// in the same direction go in one system call (a window of 8-byte writes
// costs one call instead of one each), large ones alone, in chunks. A
// batch that fails or comes up short is redone op by op, so that each
// error names its op. It returns the errors and how many ops failed.
func cmaCopyAll(lim limit, ops []opSpec, errs []error) ([]error, int) {
	failed := 0
	one := func(o *opSpec) {
		if err := cmaCopy(lim, o); err != nil {
			errs = append(errs, err)
			failed++
		}
	}
	bt := cmaBatches.Get().(*cmaBatch)
	defer cmaBatches.Put(bt)
	n, pid, op := 0, 0, progress.Read
	var want uint64
	flush := func() {
		if n == 0 {
			return
		}
		batch := bt.ops[:n]
		n = 0
		if len(batch) == 1 || lim.err() != nil {
			for _, i := range batch {
				one(&ops[i])
			}
			return
		}
		var done int
		var err error
		if op == progress.Write {
			done, err = unix.ProcessVMWritev(pid, bt.liov[:len(batch)], bt.riov[:len(batch)], 0)
		} else {
			done, err = unix.ProcessVMReadv(pid, bt.liov[:len(batch)], bt.riov[:len(batch)], 0)
		}
		if err != nil || uint64(done) != want {
			for _, i := range batch {
				one(&ops[i])
			}
		}
	}
	for i := range ops {
		o := &ops[i]
		if o.b == nil || !o.b.cma {
			continue
		}
		if o.remote.n == 0 || o.remote.n > cmaSmall {
			flush() // ops run in the request's order
			one(o)
			continue
		}
		p := o.peer.pid
		if n == cmaBatchMax || n > 0 && (p != pid || o.op != op || want+o.remote.n > cmaChunk) {
			flush()
		}
		if n == 0 {
			pid, op, want = p, o.op, 0
		}
		local := o.local.st.mem[o.local.off : o.local.off+o.remote.n]
		bt.ops[n] = i
		bt.liov[n] = unix.Iovec{Base: &local[0], Len: o.remote.n}
		bt.riov[n] = unix.RemoteIovec{Base: uintptr(o.ep.base + o.remote.off), Len: int(o.remote.n)}
		want += o.remote.n
		n++
	}
	flush()
	clear(bt.liov[:])
	return errs, failed
}

// cmaCopy moves the op's bytes, in chunks, checking the request's
// context and deadline in between: a long copy ends at its deadline, not
// when its last byte moved.
func cmaCopy(lim limit, o *opSpec) error {
	pid := o.peer.pid
	local := o.local.st.mem[o.local.off : o.local.off+o.remote.n] // host memory: prepare routed device memory elsewhere
	remote := o.ep.base + o.remote.off
	for off := uint64(0); off < o.remote.n; {
		if err := lim.err(); err != nil {
			return lim.timeout(o, cmaProvider, cmaPeer(pid), off, cmaChunk, err)
		}
		n := min(o.remote.n-off, cmaChunk)
		liov := []unix.Iovec{{Base: &local[off], Len: n}}
		riov := []unix.RemoteIovec{{Base: uintptr(remote + off), Len: int(n)}}
		var done int
		var err error
		if o.op == progress.Write {
			done, err = unix.ProcessVMWritev(pid, liov, riov, 0)
		} else {
			done, err = unix.ProcessVMReadv(pid, liov, riov, 0)
		}
		if err != nil {
			return cmaError(o.op, pid, off, n, err)
		}
		if done == 0 {
			return &CMAError{Op: o.op, Peer: cmaPeer(pid), Offset: off, Len: n, Errno: unix.EFAULT}
		}
		off += uint64(done)
	}
	return nil
}

// CMAAvailable reports whether managers of this process move same-node
// bytes themselves with process_vm_readv/writev (the cma path), and why
// not when they do not.
func CMAAvailable() (bool, string) { return cmaAvailable() }
