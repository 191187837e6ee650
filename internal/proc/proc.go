// Package proc answers what fitransfer asks the OS about other processes:
// whether one is gone, and what it maps.
package proc

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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

// Mapping is one line of /proc/PID/maps: a range of the process's
// address space and the file behind it.
type Mapping struct {
	Start, End uint64
	Dev        uint64 // the file's device, as fstat gives it (unix.Mkdev)
	Inode      uint64
	// Path is the file's path, " (deleted)" at its end when the file
	// was removed since; empty for anonymous memory.
	Path string
}

// ReadMaps reads process pid's mappings from /proc/PID/maps (pid 0: this
// process): what the kernel says the process maps, whatever it told.
func ReadMaps(pid int) ([]Mapping, error) {
	path := "/proc/self/maps"
	if pid != 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/maps"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Mapping
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if m, ok := parseMapping(line); ok {
			out = append(out, m)
		}
	}
	return out, nil
}

// parseMapping parses "start-end perms offset MAJ:MIN inode path", the
// numbers in hex but the inode; the path (which may hold spaces) is the
// rest of the line past the padding.
func parseMapping(line []byte) (Mapping, bool) {
	var m Mapping
	field := func() string {
		line = bytes.TrimLeft(line, " ")
		i := bytes.IndexByte(line, ' ')
		if i < 0 {
			i = len(line)
		}
		f := string(line[:i])
		line = line[i:]
		return f
	}
	addrs, _, _, dev, ino := field(), field(), field(), field(), field()
	lo, hi, ok1 := strings.Cut(addrs, "-")
	major, minor, ok2 := strings.Cut(dev, ":")
	var errs [5]error
	m.Start, errs[0] = strconv.ParseUint(lo, 16, 64)
	m.End, errs[1] = strconv.ParseUint(hi, 16, 64)
	maj, e2 := strconv.ParseUint(major, 16, 32)
	mnr, e3 := strconv.ParseUint(minor, 16, 32)
	errs[2], errs[3] = e2, e3
	m.Inode, errs[4] = strconv.ParseUint(ino, 10, 64)
	if !ok1 || !ok2 || errors.Join(errs[:]...) != nil {
		return Mapping{}, false
	}
	m.Dev = unix.Mkdev(uint32(maj), uint32(mnr))
	m.Path = string(bytes.TrimLeft(line, " "))
	return m, true
}

// Maps reports whether process pid maps the file whose device and inode
// (as fstat gives them) are dev and ino. An owner asks it of a peer's use
// page: a peer that still maps the page may still mark ops in it. It
// reports true when the maps cannot be read (unless the process is gone),
// or not within mapsBound (ReadMapsWithin): the caller then keeps assuming
// the mapping. Only mappings count, not open descriptors: a peer maps its
// use page as it receives it, and never maps it again once it unmapped it.
func Maps(pid int, dev, ino uint64) bool {
	maps, err := ReadMapsWithin(pid, mapsBound)
	if errors.Is(err, ErrMapsSlow) {
		return true
	}
	if err != nil {
		gone, _ := Gone(pid)
		return !gone
	}
	for _, m := range maps {
		if m.Dev == dev && m.Inode == ino {
			return true
		}
	}
	return false
}

// mapsBound is how long Maps waits for a process's maps.
const mapsBound = 200 * time.Millisecond

// ErrMapsSlow is ReadMapsWithin's error for maps that did not come in
// time.
var ErrMapsSlow = errors.New("the process's maps did not come in time (its memory map lock is held)")

// ReadMapsWithin is ReadMaps of another process, for at most d: the read
// waits for the process's memory map lock, which the process can hold (a
// thread of it stuck in a fault), and a peer must not hold its owner's
// Close by that. Past d it returns ErrMapsSlow and leaves the read to
// finish alone; until it does, later calls for pid wait for that read
// instead of starting another, so a process that stays stuck holds one
// goroutine (and its thread), however often it is asked.
func ReadMapsWithin(pid int, d time.Duration) ([]Mapping, error) {
	slowReads.mu.Lock()
	r := slowReads.m[pid]
	if r == nil {
		r = &mapsRead{done: make(chan struct{})}
		if slowReads.m == nil {
			slowReads.m = map[int]*mapsRead{}
		}
		slowReads.m[pid] = r
		read := readMaps
		go func() {
			r.maps, r.err = read(pid)
			slowReads.mu.Lock()
			delete(slowReads.m, pid)
			slowReads.mu.Unlock()
			close(r.done)
		}()
	}
	slowReads.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.done:
		return r.maps, r.err // shared with the other callers of the read: not to be changed
	case <-t.C:
		return nil, ErrMapsSlow
	}
}

// mapsRead is a read of a process's maps under way (ReadMapsWithin):
// maps and err are set before done is closed.
type mapsRead struct {
	done chan struct{}
	maps []Mapping
	err  error
}

// slowReads are the reads under way, by process.
var slowReads struct {
	mu sync.Mutex
	m  map[int]*mapsRead
}

// readMaps is ReadMaps, or what a test puts in its place.
var readMaps = ReadMaps
