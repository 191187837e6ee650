package proc_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

// procState is a process's state letter from /proc/PID/stat, or 0.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

// TestGone: a live process is not gone; a zombie (exited, not
// reaped), which kill(pid, 0) still finds, is, and its pidfd says so
// (PidfdExited); so is a reaped one.
func TestGone(t *testing.T) {
	gone, why := proc.Gone(os.Getpid())
	assert.False(t, gone, why)
	gone, _ = proc.Gone(0)
	assert.False(t, gone, "no pid: nothing to say")

	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	pid := cmd.Process.Pid
	reaped := false
	t.Cleanup(func() {
		if !reaped {
			_ = cmd.Wait()
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for procState(pid) != 'Z' {
		require.True(t, time.Now().Before(deadline), "%d did not become a zombie (state %q)", pid, procState(pid))
		time.Sleep(time.Millisecond)
	}
	require.NoError(t, unix.Kill(pid, 0), "kill(pid, 0) finds the zombie: it cannot tell")
	pidfd, err := unix.PidfdOpen(pid, 0)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	assert.True(t, proc.PidfdExited(pidfd), "a zombie's pidfd says it exited")
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	require.NoError(t, err)
	defer unix.Close(self)
	assert.False(t, proc.PidfdExited(self), "a live process's pidfd does not")
	gone, why = proc.Gone(pid)
	assert.True(t, gone, "a zombie is gone")
	assert.Contains(t, why, "zombie")

	require.NoError(t, cmd.Wait())
	reaped = true
	gone, why = proc.Gone(pid)
	assert.True(t, gone, "a reaped process is gone")
	assert.Contains(t, why, "no longer exists")
}

// TestGoneAllocatesLittle: asking about a live process allocates at most
// once (unix.Open's copy of the path): progress loops ask it of every shm
// job still running, every CheckEvery.
func TestGoneAllocatesLittle(t *testing.T) {
	if testenv.RaceEnabled {
		t.Skip("the race detector allocates for its own bookkeeping")
	}
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	allocs := testing.AllocsPerRun(100, func() {
		if gone, why := proc.Gone(pid); gone {
			t.Fatalf("a live process is gone: %s", why)
		}
	})
	t.Logf("%v allocations", allocs)
	assert.LessOrEqual(t, allocs, 1.0)
}

// TestMaps: a file this process maps shows in its maps, by device and
// inode (Maps) and by path, with its range (ReadMaps); once unmapped it
// does not. Paths keep their spaces and the kernel's " (deleted)".
func TestMaps(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "maps test")
	require.NoError(t, err)
	defer f.Close()
	const size = 3 * 4096
	require.NoError(t, f.Truncate(size))
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(int(f.Fd()), &st))
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	require.NoError(t, err)
	require.NoError(t, os.Remove(f.Name()))

	assert.True(t, proc.Maps(os.Getpid(), uint64(st.Dev), st.Ino))
	maps, err := proc.ReadMaps(0)
	require.NoError(t, err)
	var found []proc.Mapping
	for _, m := range maps {
		if m.Inode == st.Ino && m.Dev == uint64(st.Dev) {
			found = append(found, m)
		}
	}
	require.Len(t, found, 1)
	assert.Equal(t, f.Name()+" (deleted)", found[0].Path)
	assert.Equal(t, uint64(size), found[0].End-found[0].Start)

	require.NoError(t, unix.Munmap(b))
	assert.False(t, proc.Maps(os.Getpid(), uint64(st.Dev), st.Ino))
	_, err = proc.ReadMaps(1 << 23) // no such process
	assert.Error(t, err)
}

// TestMapsIsBounded: Maps of a process whose maps do not come (its memory
// map lock held: the read waits for it) answers "maps" within its bound,
// the cautious answer, instead of waiting with the read; asked again
// meanwhile, it waits for the same read instead of starting another (each
// stuck read holds a thread).
func TestMapsIsBounded(t *testing.T) {
	const pid = 1 << 23 // no such process: only the fake reader sees it
	stuck := make(chan struct{})
	defer close(stuck)
	var reads atomic.Int32
	defer proc.SetReadMaps(func(int) ([]proc.Mapping, error) {
		reads.Add(1)
		<-stuck
		return nil, nil
	})()
	for i := range 5 {
		answer := make(chan bool, 1)
		go func() { answer <- proc.Maps(pid, 1, 2) }()
		select {
		case maps := <-answer:
			assert.True(t, maps, "unknown counts as mapped (ask %d)", i)
		case <-time.After(10 * time.Second):
			t.Fatal("Maps waits with a read that does not return")
		}
	}
	assert.Equal(t, int32(1), reads.Load(), "reads of the stuck process's maps")
	_, err := proc.ReadMapsWithin(pid, time.Millisecond)
	assert.ErrorIs(t, err, proc.ErrMapsSlow)
}
