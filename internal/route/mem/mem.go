// Package mem is the route to a verified process of this node whose
// buffer lives in a memfd (mr.Alloc): the owner hands the file over the
// verified Unix socket, the initiator maps it, and an op is a plain copy,
// with no system call.
//
// What keeps a peer to what the owner registered for it:
//   - the owner shares a file only when the registration is the whole
//     file, and a buffer peers may only read as a read-only file, so the
//     kernel refuses a writable mapping;
//   - each op checks the buffer's guard entry (mapped read-only from the
//     owner) before it copies, and marks itself in a use page of its own
//     that the owner reads: Buffer.Close changes the entry, then waits
//     until no peer's use of the buffer is marked (Uses).
package mem

import (
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// Name is the route's name in handles, errors and Route.
const Name = "mem"

// Route is the mem route. The mappings are the transport's, per owner.
type Route struct{}

var _ route.Route = Route{}

// Kind is route.Mem.
func (Route) Kind() route.Kind { return route.Mem }

// Name is "mem".
func (Route) Name() string { return Name }

// Wedged is nil: a copy cannot wedge.
func (Route) Wedged() error { return nil }

// Close is a no-op.
func (Route) Close() error { return nil }

// Map maps size bytes of a file an owner sent, after checking that it
// cannot be shrunk under the mapping (a shrunk file makes this process's
// own accesses fault) and holds size bytes. It maps the file writable when
// the file was opened so and write is set, read-only otherwise. It takes
// the fd: closed when Map returns.
func Map(fd int, size int, write bool) (m []byte, writable bool, err error) {
	defer unix.Close(fd)
	if size <= 0 {
		return nil, false, fmt.Errorf("mapping %d bytes", size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, false, fmt.Errorf("the owner's file is not a sealed memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return nil, false, fmt.Errorf("the owner's file can shrink (seals %#x): mapping it could fault", seals)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		// A hugetlbfs memfd can be sealed too, yet fault on a page its
		// owner punched out.
		return nil, false, fmt.Errorf("the owner's file is not a memfd of ordinary memory")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, false, err
	}
	if st.Size < int64(size) {
		return nil, false, fmt.Errorf("the owner's file holds %d bytes, not %d", st.Size, size)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, false, err
	}
	prot := unix.PROT_READ
	if write && fl&unix.O_ACCMODE == unix.O_RDWR {
		prot |= unix.PROT_WRITE
		writable = true
	}
	m, err = unix.Mmap(fd, 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, false, fmt.Errorf("mapping the owner's file: %w", err)
	}
	return m, writable, nil
}

// Unmap undoes Map.
func Unmap(m []byte) {
	if m != nil {
		_ = unix.Munmap(m)
	}
}

// Uses is a use page: one counter per guard slot of an owner, written by
// one peer (its ops on the slot's buffer) and read by the owner.
type Uses []uint32

// UsesOf is the use page over mapped memory.
func UsesOf(m []byte) Uses { return Uses(mr.Words32(m)) }

// Mark marks an op on slot's buffer. The op checks that the buffer is
// still open only after Mark, and Close does the reverse (it changes the
// buffer's guard entry, then reads the marks), so one of them sees the
// other: either the op sees the buffer closed, or Close sees the mark and
// waits for Leave.
func (u Uses) Mark(slot uint32) { atomic.AddUint32(&u[slot], 1) }

// Leave ends an op that Mark marked.
func (u Uses) Leave(slot uint32) { atomic.AddUint32(&u[slot], ^uint32(0)) }

// InUse reports whether an op on slot's buffer is marked.
func (u Uses) InUse(slot uint32) bool { return atomic.LoadUint32(&u[slot]) != 0 }

// Owner is what Copy looks at between pieces: the buffer's generation
// in the owner's guard table, the handle's, and whether the owner is gone.
type Owner struct {
	PID  int
	Gen  *uint64 // in the mapped guard table
	Want uint64
	Gone *atomic.Bool
}

// Errors of Copy when the owner changed under it.
var (
	ErrClosed = errors.New("the owner closed the buffer")
	ErrGone   = errors.New("the owner is gone")
)

// Open is nil while the owner lives and has the buffer open, ErrGone or
// ErrClosed otherwise.
func (o *Owner) Open() error {
	switch {
	case o.Gone.Load():
		return ErrGone
	case atomic.LoadUint64(o.Gen) != o.Want:
		return ErrClosed
	}
	return nil
}

// Copy runs one op between local and the owner's mapped bytes, in
// pieces, looking at the limit and at the owner between them: a read
// copies remote into local, a write local into remote.
func Copy(lim route.Limit, op progress.Op, local, remote []byte, o *Owner) error {
	dst, src := local, remote
	if op == progress.Write {
		dst, src = remote, local
	}
	n := uint64(len(dst))
	for off := uint64(0); off < n; off += route.Piece {
		if off > 0 {
			if err := lim.Err(); err != nil {
				return lim.Timeout(op, Name, cma.Peer(o.PID), n, off, route.Piece, err)
			}
			if err := o.Open(); err != nil {
				return err
			}
		}
		end := min(off+route.Piece, n)
		copy(dst[off:end], src[off:end])
	}
	return nil
}

// Env switches the mem route off when set to 0.
const Env = mr.ShareEnv

// Enabled reports whether the mem route may be used, and why not: where
// mr.Alloc backs memory with memfds (mr.Shares).
func Enabled() (bool, string) { return mr.Shares() }
