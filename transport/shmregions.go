package transport

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// libfabric's shm provider keeps each endpoint's region in a file of
// /dev/shm named "PID:UID:INDEX" and unlinks it when the endpoint closes.
// A process killed with its endpoint open leaves the file behind (16 MiB
// each). A manager opening shm removes those of dead processes of its own
// user, once per process.
//
// A PID in the name is the creator's in its own PID namespace: a process
// of another namespace that shares /dev/shm (a container with the host's
// IPC) names its regions with PIDs that mean nothing here, or another
// process. So a file whose PID names no process here is removed only
// when no process maps it for writing, as every live endpoint maps its
// region and every peer it talks to maps it too: a read lease
// (F_SETLEASE), which the kernel refuses while the file is open for
// writing, mapped or not (a review removed a live serve's region from a
// new PID namespace).

var shmRegionName = regexp.MustCompile(`^([0-9]+):([0-9]+):([0-9]+)$`)

var reclaimOnce sync.Once

// reclaimShmRegions removes the shm regions of processes of this user
// that no longer exist; it returns their names.
func reclaimShmRegions(dir string) []string {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	uid := os.Geteuid()
	var removed []string
	for _, e := range ents {
		m := shmRegionName.FindStringSubmatch(e.Name())
		if m == nil || m[2] != strconv.Itoa(uid) || !e.Type().IsRegular() {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || pid <= 0 || processExists(pid) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		fi, err := os.Lstat(path)
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != uid {
			continue // named for this user, but another's file: not ours to remove
		}
		if !unused(path) {
			continue
		}
		if os.Remove(path) == nil {
			removed = append(removed, e.Name())
		}
	}
	return removed
}

// processExists reports whether pid names a process, zombies included
// (their pid is not reused until they are reaped).
func processExists(pid int) bool {
	return syscall.Kill(pid, 0) != syscall.ESRCH
}

// unused reports whether no process has the file at path open for
// writing, a shared writable mapping included: whether the kernel grants
// a read lease on it. Anything else (leases disabled, another owner)
// counts as in use.
func unused(path string) bool {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_RDLCK); err != nil {
		return false
	}
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETLEASE, unix.F_UNLCK)
	return true
}
