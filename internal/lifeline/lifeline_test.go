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
// not alive once the process is gone: the kernel marked it.
func TestKilledHolder(t *testing.T) {
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
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the child did not hold its lifeline")
	require.Equal(t, "held\n", line)
	assert.True(t, Alive(word(b)), "the child lives")

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
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
