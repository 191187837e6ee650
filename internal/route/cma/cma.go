// Package cma is the route fitransfer takes itself to a process of this
// node that the kernel verified (same node, same user): process_vm_readv
// and process_vm_writev. It exists because libfabric's shm can be left
// deaf for good by a peer that dies mid-copy (docs/RELIABILITY.md, "Why
// cma"); the transport checks the owner's guard entry, read with ReadAt,
// before any op.
//
// The copy is synchronous: when Run returns nil for an op, its bytes are
// in the destination process's memory, so a write is delivery-complete.
package cma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/progress"
)

// Name is the route's name in handles and errors.
const Name = "cma"

const (
	chunk = route.Piece // bytes per system call, so that the limit is checked in between
	small = 1 << 20     // ops up to this size share system calls
	// batchMax is how many ops one process_vm_readv/writev call carries
	// (IOV_MAX is 1024).
	batchMax = 256
)

var available struct {
	once sync.Once
	ok   bool
	why  string
}

// Available reports whether this process uses the cma route, and why not
// when it does not: FITRANSFER_CMA=0, or a yama ptrace_scope that
// restricts process_vm_* to descendants or less.
func Available() (bool, string) {
	available.once.Do(func() {
		scope := PtraceScope()
		switch {
		case os.Getenv("FITRANSFER_CMA") == "0":
			available.why = "disabled by FITRANSFER_CMA=0"
		case scope != "" && scope != "0":
			available.why = "yama ptrace_scope=" + scope + " restricts process_vm_readv"
		default:
			available.ok = true
		}
	})
	return available.ok, available.why
}

// PtraceScope is the yama LSM's ptrace_scope ("" without yama).
func PtraceScope() string {
	b, _ := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	return strings.TrimSpace(string(b))
}

// Route is the cma route of a manager: its role and why it was chosen.
type Route struct {
	Role, Reason string
}

var _ route.Route = (*Route)(nil)

// Kind is route.CMA.
func (*Route) Kind() route.Kind { return route.CMA }

// Name is "cma".
func (*Route) Name() string { return Name }

// Wedged is nil: a system call that copies does not wedge.
func (*Route) Wedged() error { return nil }

// Close is a no-op: the route holds no kernel object.
func (*Route) Close() error { return nil }

// Reach remembers, per process, whether process_vm_readv reaches it.
type Reach struct {
	mu   sync.Mutex
	seen map[int]bool
}

// Reaches probes once whether process_vm_readv reads addr in process pid
// (ptrace rules, pid namespaces), and remembers the answer.
func (r *Reach) Reaches(pid int, addr uint64) bool {
	r.mu.Lock()
	ok, known := r.seen[pid]
	r.mu.Unlock()
	if known {
		return ok
	}
	ok = Reaches(pid, addr)
	r.mu.Lock()
	if r.seen == nil {
		r.seen = map[int]bool{}
	}
	r.seen[pid] = ok
	r.mu.Unlock()
	return ok
}

// Reaches reports whether process_vm_readv can read addr in process pid.
func Reaches(pid int, addr uint64) bool {
	if pid == os.Getpid() {
		return true
	}
	var b [1]byte
	n, err := unix.ProcessVMReadv(pid,
		[]unix.Iovec{{Base: &b[0], Len: 1}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: 1}}, 0)
	return err == nil && n == 1
}

// ProcName is how handles name a process on the cma route.
func ProcName(pid int) []byte { return []byte(strconv.Itoa(pid)) }

// PID is the process a cma name names, or 0.
func PID(name []byte) int {
	// Digits only, parsed here: strconv.Atoi (which also takes a sign)
	// was a twelfth of an 8 B mem op, which checks a handle's name
	// against its verified owner.
	if len(name) == 0 || len(name) > 10 {
		return 0
	}
	var pid uint64 // ten digits overflow a 32-bit int
	for _, c := range name {
		if c < '0' || c > '9' {
			return 0
		}
		pid = 10*pid + uint64(c-'0')
	}
	if pid > math.MaxInt32 {
		return 0
	}
	return int(pid)
}

// Peer is how errors name a process.
func Peer(pid int) string { return "process " + strconv.Itoa(pid) }

// Error is a failed cma copy.
type Error struct {
	Op     progress.Op
	Peer   string
	Offset uint64
	Len    uint64
	Errno  syscall.Errno
}

func (e *Error) Error() string {
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
func (e *Error) Unwrap() error { return e.Errno }

// errorOf turns a system call's error into the op's: a process that is
// gone (ESRCH: no such process, or a zombie without memory) is
// ErrPeerGone's *progress.PeerGoneError.
func errorOf(op progress.Op, pid int, off, n uint64, err error) error {
	var errno syscall.Errno
	if errors.As(err, &errno) && errno == unix.ESRCH {
		_, why := proc.Gone(pid)
		if why == "" {
			why = "process " + strconv.Itoa(pid) + " no longer exists"
		}
		return &progress.PeerGoneError{Op: op, Provider: Name, Peer: Peer(pid), Cause: why}
	}
	if errors.As(err, &errno) {
		return &Error{Op: op, Peer: Peer(pid), Offset: off, Len: n, Errno: errno}
	}
	return err
}

// stillOpen reads the owner's generation word of o's buffer: ErrClosed
// when it changed, so that a Close stops the copy within a piece.
func stillOpen(o *Op, off uint64) error {
	if o.GenWord != nil {
		if atomic.LoadUint64(o.GenWord) != o.Gen {
			return fmt.Errorf("%s over cma at offset %d of %d bytes: %w", o.Dir, off, len(o.Local), ErrClosed)
		}
		return nil
	}
	var gen [8]byte
	if err := ReadAt(o.Dir, o.PID, o.GenAt, gen[:], uint64(len(o.Local))); err != nil {
		var ce *Error
		if errors.As(err, &ce) && ce.Errno == unix.EFAULT {
			// The verified owner's guard table is gone: its manager
			// closed, and every buffer of it with it.
			return fmt.Errorf("%s over cma at offset %d of %d bytes: %w (its manager closed)", o.Dir, off, len(o.Local), ErrClosed)
		}
		return err
	}
	if binary.LittleEndian.Uint64(gen[:]) != o.Gen {
		return fmt.Errorf("%s over cma at offset %d of %d bytes: %w", o.Dir, off, len(o.Local), ErrClosed)
	}
	return nil
}

// ReadAt reads len(buf) bytes at addr in process pid, for an op of n
// bytes: the owner's guard entry, checked before the op.
func ReadAt(op progress.Op, pid int, addr uint64, buf []byte, n uint64) error {
	got, err := unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}, 0)
	if err != nil {
		return errorOf(op, pid, 0, n, err)
	}
	if got != len(buf) {
		return &Error{Op: op, Peer: Peer(pid), Len: uint64(len(buf)), Errno: unix.EFAULT}
	}
	return nil
}

// Op is one copy: Local's bytes to or from Remote in process PID. A copy
// of more than one piece reads the owner's word at GenAt (when not 0)
// before each later piece and stops with ErrClosed when it is no longer
// Gen: the owner closed the buffer meanwhile. GenWord, when set, is that
// word as mapped from the owner (a mem link's generations page): loaded
// instead of read with a system call.
type Op struct {
	Dir     progress.Op
	PID     int
	Local   []byte
	Remote  uint64
	GenAt   uint64
	Gen     uint64
	GenWord *uint64
	Mark    Mark
	marked  bool
}

// Mark is where an op marks itself while it copies, so that the owner's
// Close waits for it: the counter of the buffer's slot in this process's
// use page at the owner (a mem link's), and whether that link ended (the
// owner may no longer count the page). An op with a Mark has a GenWord.
// The op marks, then loads the generation; the owner's Close changes the
// generation, then reads the marks: one of them sees the other.
type Mark struct {
	Use   *uint32
	Ended *atomic.Bool
}

// ErrUnmarked is an op whose mark's link had ended: the owner might not
// wait for it, so it does not run (nothing moved).
var ErrUnmarked = errors.New("the link the owner counts this process's ops through ended before the op was marked")

// Begin marks a use, then loads the generation at word: ErrClosed when
// it is no longer gen, ErrUnmarked when the link ended (the mark then
// ended too). End ends a use Begin marked.
func (k Mark) Begin(word *uint64, gen uint64) error {
	atomic.AddUint32(k.Use, 1)
	if k.Ended.Load() {
		k.End()
		return ErrUnmarked
	}
	if atomic.LoadUint64(word) != gen {
		k.End()
		return ErrClosed
	}
	return nil
}

// End ends a use Begin left marked.
func (k Mark) End() { atomic.AddUint32(k.Use, ^uint32(0)) }

// begin marks o (when it has a Mark) and checks that its buffer is still
// open: ErrClosed when the owner closed it before the copy.
func begin(o *Op) error {
	if o.Mark.Use == nil {
		return nil
	}
	if err := o.Mark.Begin(o.GenWord, o.Gen); err != nil {
		return fmt.Errorf("%s over cma before the copy of %d bytes: %w", o.Dir, len(o.Local), err)
	}
	o.marked = true
	return nil
}

// end ends o's mark, if it has one.
func end(o *Op) {
	if o.marked {
		o.marked = false
		o.Mark.End()
	}
}

// ErrClosed is a copy that the owner's Close stopped before it began or
// between pieces.
var ErrClosed = errors.New("the owner closed the buffer")

// batch is the iovecs of one call, pooled so that a request of small ops
// allocates nothing.
type batch struct {
	ops  [batchMax]int // indices into the request's ops
	liov [batchMax]unix.Iovec
	riov [batchMax]unix.RemoteIovec
}

var batches = sync.Pool{New: func() any { return new(batch) }}

// Run runs a request's cma ops: small ops to the same process in the
// same direction go in one system call (a window of 8-byte writes costs
// one call instead of one each), large ones alone, in chunks. A batch
// that fails or comes up short is redone op by op, so that each error
// names its op. Ops with a Mark are marked only during their own system
// calls. It sets errs[i] for each op i that failed and returns how many
// did.
func Run(lim route.Limit, ops []Op, errs []error) int {
	failed := 0
	one := func(i int) {
		if err := Copy(lim, &ops[i]); err != nil {
			errs[i] = err
			failed++
		}
	}
	bt := batches.Get().(*batch)
	defer batches.Put(bt)
	n, pid, dir := 0, 0, progress.Read
	var want uint64
	flush := func() {
		if n == 0 {
			return
		}
		todo := bt.ops[:n]
		n = 0
		if len(todo) == 1 || lim.Err() != nil {
			for _, i := range todo {
				one(i)
			}
			return
		}
		// The batch's marks last for its one call; an op found closed
		// sends the batch op by op, each with its own error.
		for k, i := range todo {
			if begin(&ops[i]) != nil {
				for _, j := range todo[:k] {
					end(&ops[j])
				}
				for _, j := range todo {
					one(j)
				}
				return
			}
		}
		var done int
		var err error
		if dir == progress.Write {
			done, err = unix.ProcessVMWritev(pid, bt.liov[:len(todo)], bt.riov[:len(todo)], 0)
		} else {
			done, err = unix.ProcessVMReadv(pid, bt.liov[:len(todo)], bt.riov[:len(todo)], 0)
		}
		for _, i := range todo {
			end(&ops[i])
		}
		if err != nil || uint64(done) != want {
			for _, i := range todo {
				one(i)
			}
		}
	}
	for i := range ops {
		o := &ops[i]
		size := uint64(len(o.Local))
		if size == 0 || size > small {
			flush() // ops run in the request's order
			one(i)
			continue
		}
		if n == batchMax || n > 0 && (o.PID != pid || o.Dir != dir || want+size > chunk) {
			flush()
		}
		if n == 0 {
			pid, dir, want = o.PID, o.Dir, 0
		}
		bt.ops[n] = i
		bt.liov[n] = unix.Iovec{Base: &o.Local[0], Len: size}
		bt.riov[n] = unix.RemoteIovec{Base: uintptr(o.Remote), Len: int(size)}
		want += size
		n++
	}
	flush()
	clear(bt.liov[:])
	return failed
}

// Copy moves one op's bytes, in chunks, looking at the limit in between:
// a long copy ends at its deadline, not when its last byte moved. An op
// with a Mark is marked from before its first piece to after its last.
func Copy(lim route.Limit, o *Op) error {
	if err := begin(o); err != nil {
		return err
	}
	defer end(o)
	size := uint64(len(o.Local))
	for off := uint64(0); off < size; {
		if err := lim.Err(); err != nil {
			return lim.Timeout(o.Dir, Name, Peer(o.PID), size, off, chunk, err)
		}
		if off > 0 && (o.GenAt != 0 || o.GenWord != nil) {
			if err := stillOpen(o, off); err != nil {
				return err
			}
		}
		n := min(size-off, chunk)
		liov := []unix.Iovec{{Base: &o.Local[off], Len: n}}
		riov := []unix.RemoteIovec{{Base: uintptr(o.Remote + off), Len: int(n)}}
		var done int
		var err error
		if o.Dir == progress.Write {
			done, err = unix.ProcessVMWritev(o.PID, liov, riov, 0)
		} else {
			done, err = unix.ProcessVMReadv(o.PID, liov, riov, 0)
		}
		if err == nil && done == 0 {
			err = unix.EFAULT
		}
		if err != nil {
			// The owner's Close unmaps a Manager.Alloc buffer: EFAULT
			// then means closed, not freed while registered.
			if (o.GenAt != 0 || o.GenWord != nil) && !errors.Is(err, unix.ESRCH) {
				if cerr := stillOpen(o, off); errors.Is(cerr, ErrClosed) {
					return cerr
				}
			}
			return errorOf(o.Dir, o.PID, off, n, err)
		}
		off += uint64(done)
	}
	return nil
}
