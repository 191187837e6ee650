package transport

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"syscall"
)

// libfabric's shm provider keeps each endpoint's region in a file of
// /dev/shm named "PID:UID:INDEX" and unlinks it when the endpoint closes.
// A process killed with its endpoint open leaves the file behind (16 MiB
// each). A manager opening shm removes those of dead processes of its own
// user, once per process.

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
