package proc

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
	gone, why := Gone(os.Getpid())
	assert.False(t, gone, why)
	gone, _ = Gone(0)
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
	assert.True(t, PidfdExited(pidfd), "a zombie's pidfd says it exited")
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	require.NoError(t, err)
	defer unix.Close(self)
	assert.False(t, PidfdExited(self), "a live process's pidfd does not")
	gone, why = Gone(pid)
	assert.True(t, gone, "a zombie is gone")
	assert.Contains(t, why, "zombie")

	require.NoError(t, cmd.Wait())
	reaped = true
	gone, why = Gone(pid)
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
		if gone, why := Gone(pid); gone {
			t.Fatalf("a live process is gone: %s", why)
		}
	})
	t.Logf("%v allocations", allocs)
	assert.LessOrEqual(t, allocs, 1.0)
}
