package mr

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrNotOffHeap is returned when memory to register was not allocated by
// Alloc (nor declared with Adopt).
var ErrNotOffHeap = errors.New("memory is not off the Go heap")

// region is one Alloc'd or adopted range.
type region struct {
	base, end uintptr
	mapped    []byte // set for Alloc'd memory (to munmap)
	fd        int    // the memfd behind Alloc'd memory; -1 without
	holds     int    // registrations using it (Hold): Free refuses it meanwhile
}

var regions struct {
	sync.RWMutex
	list []region // sorted by base
}

// Alloc maps n bytes of zeroed, page-aligned memory outside the Go heap.
// Free it with Free when no registration uses it any more.
//
// Where Shares allows it, the memory is a memfd's, sealed at its size: a
// verified process of this node can be handed the file and map it (see
// File), so that transfers with it are plain copies. Otherwise, or where
// memfd_create is refused, it is anonymous memory, which only the other
// routes reach.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mr.Alloc(%d): size must be positive", n)
	}
	if ok, _ := Shares(); ok {
		if b, fd, err := allocShared(n); err == nil {
			add(region{base: Addr(b), end: Addr(b) + uintptr(n), mapped: b, fd: fd})
			return b[:n], nil
		}
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mr.Alloc(%d): mmap: %w", n, err)
	}
	add(region{base: Addr(b), end: Addr(b) + uintptr(n), mapped: b, fd: -1})
	return b, nil
}

// AllocPublished is Alloc for memory this process writes and the
// processes it hands the file to may only read: after this process maps
// it, it is sealed against every other write (F_SEAL_FUTURE_WRITE), so
// that a process that reopens the file read-write through /proc still
// cannot write it. It is backed by a memfd whatever Shares says: it is
// for what fitransfer publishes to its peers (generations), never for
// the caller's data. It fails where memfd_create does.
func AllocPublished(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mr.AllocPublished(%d): size must be positive", n)
	}
	b, fd, err := allocFile(n, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
	if err != nil {
		return nil, fmt.Errorf("mr.AllocPublished(%d): %w", n, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SEAL); err != nil {
		_ = unix.Munmap(b)
		_ = unix.Close(fd)
		return nil, fmt.Errorf("mr.AllocPublished(%d): sealing: %w", n, err)
	}
	add(region{base: Addr(b), end: Addr(b) + uintptr(n), mapped: b, fd: fd})
	return b[:n], nil
}

// AllocControl is Alloc backed by a memfd whatever Shares says, for a page
// that fitransfer hands to one verified peer to coordinate with it (the
// marks of its ops in flight), never for the caller's data: Shares keeps
// memfds from user memory because any process of the user may open one
// through /proc. Such a process can change the marks of a control page,
// and so make the owner wait for, or stop waiting for, a peer's ops; but
// where Shares says no because of yama the only same-node route left is
// libfabric's shm, whose regions in /dev/shm any process of the user can
// write already, and with FITRANSFER_MEM=0 alone it may ptrace the owner.
// It fails where memfd_create does.
func AllocControl(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mr.AllocControl(%d): size must be positive", n)
	}
	b, fd, err := allocShared(n)
	if err != nil {
		return nil, fmt.Errorf("mr.AllocControl(%d): %w", n, err)
	}
	add(region{base: Addr(b), end: Addr(b) + uintptr(n), mapped: b, fd: fd})
	return b[:n], nil
}

// allocShared maps n bytes of a new memfd, rounded up to whole pages and
// sealed at that size: whoever is handed the file can neither shrink it
// (which would make the owner's own accesses fault) nor grow it.
func allocShared(n int) ([]byte, int, error) {
	return allocFile(n, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
}

// allocFile maps n bytes, rounded up to whole pages, of a new memfd with
// seals added before the mapping.
func allocFile(n int, seals int) ([]byte, int, error) {
	size := (n + pageSize - 1) &^ (pageSize - 1)
	fd, err := unix.MemfdCreate("fitransfer", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, err
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return nil, -1, err
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		_ = unix.Close(fd)
		return nil, -1, err
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return nil, -1, err
	}
	return b, fd, nil
}

var pageSize = unix.Getpagesize()

// ShareEnv switches memfd-backed allocations (and so the mem route) off
// when set to 0.
const ShareEnv = "FITRANSFER_MEM"

var shares struct {
	once sync.Once
	ok   bool
	why  string
}

// Shares reports whether Alloc backs memory with memfds that processes of
// this user may be handed, and why not. Any process of the user can open
// a memfd of another through /proc/PID/fd, which needs only the ptrace
// "read" right; so memfds are used only where the yama LSM lets such a
// process attach anyway (ptrace_scope 0, or no yama): there it can read
// and write all of this process's memory already, and a memfd gives it
// nothing more. FITRANSFER_MEM=0 switches them off.
func Shares() (bool, string) {
	shares.once.Do(func() {
		b, _ := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
		scope := strings.TrimSpace(string(b))
		switch {
		case os.Getenv(ShareEnv) == "0":
			shares.why = "disabled by " + ShareEnv + "=0"
		case scope != "" && scope != "0":
			shares.why = "yama ptrace_scope=" + scope + ": a memfd would let processes of this user reach memory that ptrace denies them"
		default:
			shares.ok = true
		}
	})
	return shares.ok, shares.why
}

// Whole reports whether b is exactly a whole allocation of Alloc backed
// by a memfd: what File opens.
func Whole(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	base := Addr(b)
	regions.RLock()
	defer regions.RUnlock()
	i := find(base)
	return i >= 0 && regions.list[i].base == base && regions.list[i].fd >= 0 &&
		regions.list[i].mapped != nil && uintptr(len(b)) == regions.list[i].end-base
}

// File opens the memfd behind b when b is exactly a whole allocation of
// Alloc (not a part of one: the file holds all of it, and whoever maps it
// reaches all of it), read-only when readOnly is set, so that a process
// it is handed to cannot map it writable. The caller closes the new fd.
// ok is false for other memory.
func File(b []byte, readOnly bool) (fd int, ok bool, err error) {
	if len(b) == 0 {
		return -1, false, nil
	}
	base := Addr(b)
	regions.RLock()
	defer regions.RUnlock() // Free closes the file under the write lock
	i := find(base)
	if i < 0 {
		return -1, false, nil
	}
	r := regions.list[i]
	if r.base != base || r.fd < 0 || r.mapped == nil || uintptr(len(b)) != r.end-r.base {
		return -1, false, nil
	}
	if readOnly {
		// A new open file description through /proc: a dup would share
		// the read-write one.
		fd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", r.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	} else {
		fd, err = unix.FcntlInt(uintptr(r.fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err != nil {
		return -1, false, fmt.Errorf("opening the memory's file: %w", err)
	}
	return fd, true, nil
}

// Free unmaps memory returned by Alloc. It fails for memory Alloc did not
// return (a sub-slice, or adopted memory), and for memory a registration
// still uses (Hold): a peer's op could still write it, into whatever the
// next Alloc puts there.
func Free(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	base := Addr(b)
	regions.Lock()
	defer regions.Unlock()
	i := find(base)
	if i < 0 || regions.list[i].mapped == nil {
		return fmt.Errorf("mr.Free: %#x was not returned by mr.Alloc", base)
	}
	r := regions.list[i]
	if r.base != base || uintptr(len(b)) != r.end-r.base {
		return fmt.Errorf("mr.Free: %d bytes at %#x are part of an allocation of %d bytes at %#x: free the slice mr.Alloc returned, whole",
			len(b), base, r.end-r.base, r.base)
	}
	if r.holds > 0 {
		return fmt.Errorf("mr.Free: the %d bytes at %#x are still registered (%d registration(s)): close the transport.Buffer first; memory a peer may still use stays registered, and its Close says so",
			len(b), base, r.holds)
	}
	if err := unix.Munmap(regions.list[i].mapped); err != nil {
		return fmt.Errorf("mr.Free: munmap: %w", err)
	}
	if fd := regions.list[i].fd; fd >= 0 {
		_ = unix.Close(fd) // peers that mapped it keep their pages, never this process's
	}
	regions.list = append(regions.list[:i], regions.list[i+1:]...)
	return nil
}

// Hold marks b, memory from Alloc or Adopt, as used by a registration
// until the returned release is called (once; later calls do nothing):
// meanwhile Free refuses the allocation that holds it. It returns a
// release that does nothing for memory neither declared.
func Hold(b []byte) (release func()) {
	if len(b) == 0 {
		return func() {}
	}
	base := Addr(b)
	regions.Lock()
	defer regions.Unlock()
	i := find(base)
	if i < 0 {
		return func() {}
	}
	regions.list[i].holds++
	var once sync.Once
	return func() {
		once.Do(func() {
			regions.Lock()
			defer regions.Unlock()
			if i := find(base); i >= 0 && regions.list[i].holds > 0 {
				regions.list[i].holds--
			}
		})
	}
}

// Adopt declares b as memory outside the Go heap that stays mapped while
// registered — from mmap, C.malloc or a device allocator — so that it can
// be registered. Forget undoes it.
func Adopt(b []byte) error {
	if len(b) == 0 {
		return errors.New("mr.Adopt: empty slice")
	}
	base := Addr(b)
	regions.Lock()
	defer regions.Unlock()
	if i := find(base); i >= 0 || overlaps(base, base+uintptr(len(b))) {
		return fmt.Errorf("mr.Adopt: %#x overlaps memory already known", base)
	}
	insert(region{base: base, end: base + uintptr(len(b)), fd: -1})
	return nil
}

// Forget removes a range declared with Adopt.
func Forget(b []byte) {
	if len(b) == 0 {
		return
	}
	base := Addr(b)
	regions.Lock()
	defer regions.Unlock()
	if i := find(base); i >= 0 && regions.list[i].base == base && regions.list[i].mapped == nil {
		regions.list = append(regions.list[:i], regions.list[i+1:]...)
	}
}

// CheckOffHeap returns nil when all of b lies in memory from Alloc or
// Adopt, and otherwise an error wrapping ErrNotOffHeap that says what to
// do.
func CheckOffHeap(b []byte) error {
	if len(b) == 0 {
		return errors.New("empty buffer: nothing to register")
	}
	base := Addr(b)
	regions.RLock()
	defer regions.RUnlock()
	if i := find(base); i >= 0 && base+uintptr(len(b)) <= regions.list[i].end {
		return nil
	}
	return fmt.Errorf("%w: %d bytes at %#x were not allocated by mr.Alloc; "+
		"Go heap memory can move and must not be handed to libfabric: allocate with mr.Alloc(n), "+
		"or declare memory you mapped yourself with mr.Adopt", ErrNotOffHeap, len(b), base)
}

// find returns the index of the region containing addr, or -1. Callers
// hold the lock.
func find(addr uintptr) int {
	l := regions.list
	i := sort.Search(len(l), func(i int) bool { return l[i].end > addr })
	if i < len(l) && l[i].base <= addr {
		return i
	}
	return -1
}

func overlaps(base, end uintptr) bool {
	for _, r := range regions.list {
		if base < r.end && r.base < end {
			return true
		}
	}
	return false
}

func add(r region) {
	regions.Lock()
	defer regions.Unlock()
	insert(r)
}

func insert(r region) {
	l := regions.list
	i := sort.Search(len(l), func(i int) bool { return l[i].base > r.base })
	l = append(l, region{})
	copy(l[i+1:], l[i:])
	l[i] = r
	regions.list = l
}
