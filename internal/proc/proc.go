// Package proc answers what fitransfer asks the OS about other processes:
// whether one is gone.
package proc

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
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
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
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
	// state is the field after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false, ""
	}
	switch s[i+2] {
	case 'Z', 'X':
		return true, "process " + strconv.Itoa(pid) + " exited (a zombie: its parent has not reaped it yet)"
	}
	return false, ""
}
