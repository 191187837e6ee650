package lifeline

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const childEnv = "FT_LIFELINE_CHILD"

// TestMain is also the child of TestKilledHolder: it holds a lifeline in
// the memory of its fd 3, says so, and waits to be killed.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		b, err := unix.Mmap(3, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			os.Exit(2)
		}
		if _, err := Hold(b); err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString("held\n")
		select {}
	}
	os.Exit(m.Run())
}

func shared(t *testing.T) (fd int, b []byte) {
	fd, err := unix.MemfdCreate("lifeline-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, 4096))
	b, err = unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b); unix.Close(fd) })
	return fd, b
}

func word(b []byte) *uint32 { return (*uint32)(unsafe.Pointer(&b[0])) }

// TestHoldRelease: a held lifeline reads alive, a released one and one
// never held do not.
func TestHoldRelease(t *testing.T) {
	_, b := shared(t)
	assert.False(t, Alive(word(b)), "never held")
	l, err := Hold(b)
	require.NoError(t, err)
	assert.True(t, Alive(word(b)))
	l.Release()
	assert.False(t, Alive(word(b)), "released")
	l.Release() // twice is a no-op
}

// TestKilledHolder: the lifeline of a process killed with SIGKILL reads
// not alive once its pidfd says it exited: the kernel marked it. Also
// when its private memory is reaped at once (process_mrelease, as
// earlyoom does after its SIGKILL; the OOM reaper alike): the list the
// kernel walks lies in the shared page, not on the thread's stack. With
// the list on the stack (a glibc robust mutex), a review saw 214 of 400
// such deaths left unmarked.
func TestKilledHolder(t *testing.T) {
	for _, reap := range []bool{false, true} {
		t.Run(map[bool]string{false: "killed", true: "killed and reaped"}[reap], func(t *testing.T) {
			for range 20 {
				killHolder(t, reap)
			}
		})
	}
}

func killHolder(t *testing.T, reap bool) {
	fd, b := shared(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	dup, err := unix.Dup(fd)
	require.NoError(t, err)
	child := os.NewFile(uintptr(dup), "memfd")
	defer child.Close()
	cmd.ExtraFiles = []*os.File{child}
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer cmd.Wait()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the child did not hold its lifeline")
	require.Equal(t, "held\n", line)
	assert.True(t, Alive(word(b)), "the child lives")

	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	require.NoError(t, err)
	defer unix.Close(pidfd)
	require.NoError(t, unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0))
	if reap {
		// Its memory goes as soon as the kill is on its way.
		_, _, errno := unix.Syscall(unix.SYS_PROCESS_MRELEASE, uintptr(pidfd), 0, 0)
		require.True(t, errno == 0 || errno == unix.ESRCH || errno == unix.EINVAL, "process_mrelease: %v", errno)
	}
	// Marked by the time the pidfd says the process exited, before it is
	// reaped: what a peer's op that polled the pidfd would have seen.
	n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, 10_000)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the child did not exit")
	assert.False(t, Alive(word(b)), "the child was killed")
	assert.NotZero(t, *word(b)&futexOwnerDied, "the kernel marked the word")
}

// TestHoldRefusesSmallMemory: too few bytes is an error, not a write past
// them.
func TestHoldRefusesSmallMemory(t *testing.T) {
	_, b := shared(t)
	_, err := Hold(b[:Size-1])
	require.Error(t, err)
}
