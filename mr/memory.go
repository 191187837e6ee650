package mr

import (
	"errors"
	"fmt"
	"sort"
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
}

var regions struct {
	sync.RWMutex
	list []region // sorted by base
}

// Alloc maps n bytes of zeroed, page-aligned memory outside the Go heap.
// Free it with Free when no registration uses it any more.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("mr.Alloc(%d): size must be positive", n)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mr.Alloc(%d): mmap: %w", n, err)
	}
	add(region{base: Addr(b), end: Addr(b) + uintptr(n), mapped: b})
	return b, nil
}

// Free unmaps memory returned by Alloc. It fails for memory Alloc did not
// return (a sub-slice, or adopted memory).
func Free(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	base := Addr(b)
	regions.Lock()
	defer regions.Unlock()
	i := find(base)
	if i < 0 || regions.list[i].base != base || regions.list[i].mapped == nil {
		return fmt.Errorf("mr.Free: %#x was not returned by mr.Alloc", base)
	}
	if err := unix.Munmap(regions.list[i].mapped); err != nil {
		return fmt.Errorf("mr.Free: munmap: %w", err)
	}
	regions.list = append(regions.list[:i], regions.list[i+1:]...)
	return nil
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
	insert(region{base: base, end: base + uintptr(len(b))})
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
