// Package proc answers what fitransfer asks the OS about other processes:
// whether one is gone.
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Gone reports whether process pid has exited, and how that is
// known; both same-node routes (cma and shm) decide with it that a peer
// is gone. kill(pid, 0) is not enough: it succeeds on a zombie (exited,
// not yet reaped by its parent), which will never run or answer again and
// whose memory is gone, so a peer that is a zombie counts as gone. The
// process state in /proc/PID/stat says so ('Z', or 'X' while it is being
// reaped).
func Gone(pid int) (bool, string) {
	if pid <= 0 {
		return false, ""
	}
	// The path and the bytes on the stack: progress loops ask this of
	// every shm job still running, every CheckEvery, and os.ReadFile cost
	// 9 allocations; this costs the one unix.Open makes of the path.
	var path [32]byte
	p := strconv.AppendInt(append(path[:0], "/proc/"...), int64(pid), 10)
	p = append(p, "/stat"...)
	var b [256]byte
	n, err := readHead(string(p), b[:])
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ESRCH):
		return true, "process " + strconv.Itoa(pid) + " no longer exists"
	case err != nil:
		// No /proc to read: kill tells a process that exists from one
		// that does not, just not a zombie.
		if unix.Kill(pid, 0) == unix.ESRCH {
			return true, "process " + strconv.Itoa(pid) + " no longer exists"
		}
		return false, ""
	}
	// "pid (comm) state ...": comm may hold anything, ')' too, so the
	// state is the field after the last ')'; no field after it holds one,
	// so the first 256 bytes (comm is at most 64) are enough.
	s := b[:n]
	i := bytes.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false, ""
	}
	switch s[i+2] {
	case 'Z', 'X':
		return true, "process " + strconv.Itoa(pid) + " exited (a zombie: its parent has not reaped it yet)"
	}
	return false, ""
}

// readHead reads the first len(b) bytes of the file at path.
func readHead(path string, b []byte) (int, error) {
	fd, err := ignoringEINTR(func() (int, error) { return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0) })
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return ignoringEINTR(func() (int, error) { return unix.Read(fd, b) })
}

func ignoringEINTR(call func() (int, error)) (int, error) {
	for {
		n, err := call()
		if err != unix.EINTR {
			return n, err
		}
	}
}

// PidfdExited reports whether the process of pidfd has exited: a pidfd
// polls readable from then on (a zombie too). One system call.
func PidfdExited(pidfd int) bool {
	fds := [1]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds[:], 0)
	return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
}

// Maps reports whether process pid maps the file whose device and inode
// (as fstat gives them) are dev and ino, by its /proc/PID/maps. An owner
// asks it of a peer's use page: a peer that still maps the page may still
// mark ops in it. It reports true when the maps cannot be read (unless
// the process is gone): the caller then keeps assuming the mapping. Only
// mappings count, not open descriptors: a peer maps its use page as it
// receives it, and never maps it again once it unmapped it.
func Maps(pid int, dev, ino uint64) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		gone, _ := Gone(pid)
		return !gone
	}
	// "start-end perms offset MAJ:MIN inode path": the device in hex.
	want := fmt.Sprintf(" %02x:%02x %d ", unix.Major(dev), unix.Minor(dev), ino)
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if bytes.Contains(line, []byte(want)) {
			return true
		}
	}
	return false
}
