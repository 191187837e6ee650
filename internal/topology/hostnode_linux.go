package topology

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrNotResident is returned by HostNode for a page that was never
// touched: it has no node yet.
var ErrNotResident = errors.New("page not resident")

// Flags of get_mempolicy(2) (linux/mempolicy.h); x/sys/unix has no names
// for them.
const (
	mpolFNode = 1 << 0 // MPOL_F_NODE: return a node, not a policy
	mpolFAddr = 1 << 1 // MPOL_F_ADDR: of the page at addr
)

// HostNode returns the NUMA node of the page holding b[0]. b should not
// move (memory fitransfer maps, or the heap; not a goroutine stack). It
// asks move_pages(2) with no target nodes, which only reports, and falls
// back to get_mempolicy(MPOL_F_NODE|MPOL_F_ADDR) where the kernel has no
// page migration; a kernel without NUMA has one node, 0.
func HostNode(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, errors.New("NUMA node of an empty buffer")
	}
	pages := [1]uintptr{uintptr(unsafe.Pointer(&b[0]))}
	var status [1]int32
	_, _, e := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, 1, uintptr(unsafe.Pointer(&pages[0])), 0, uintptr(unsafe.Pointer(&status[0])), 0)
	runtime.KeepAlive(b)
	switch {
	case e == 0 && status[0] >= 0:
		return int(status[0]), nil
	case e == 0 && unix.Errno(-status[0]) == unix.ENOENT:
		return 0, fmt.Errorf("NUMA node of %#x: %w", pages[0], ErrNotResident)
	case e == 0:
		return 0, fmt.Errorf("NUMA node of %#x: move_pages: %w", pages[0], unix.Errno(-status[0]))
	case e != unix.ENOSYS:
		return 0, fmt.Errorf("NUMA node of %#x: move_pages: %w", pages[0], e)
	}
	var node int32
	_, _, e = unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&node)), 0, 0, pages[0], mpolFNode|mpolFAddr, 0)
	runtime.KeepAlive(b)
	switch e {
	case 0:
		return int(node), nil
	case unix.ENOSYS:
		return 0, nil
	}
	return 0, fmt.Errorf("NUMA node of %#x: get_mempolicy: %w", pages[0], e)
}
