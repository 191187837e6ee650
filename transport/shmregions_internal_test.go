package transport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestReclaimShmRegions(t *testing.T) {
	dir := t.TempDir()
	dead := exec.Command("true")
	require.NoError(t, dead.Run()) // exited and reaped: its pid names no process
	uid := strconv.Itoa(os.Geteuid())
	files := map[string]bool{ // name → removed
		strconv.Itoa(dead.Process.Pid) + ":" + uid + ":0": true,
		strconv.Itoa(dead.Process.Pid) + ":" + uid + ":1": true,
		strconv.Itoa(os.Getpid()) + ":" + uid + ":0":      false, // alive
		strconv.Itoa(dead.Process.Pid) + ":99999:0":       false, // another user's name
		"fi_shm_other": false,
		strconv.Itoa(dead.Process.Pid) + ":" + uid: false, // not a region name
	}
	for name := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	// A region a process maps for writing, as a live endpoint of another
	// PID namespace does, whose PID names no process here.
	inUse := strconv.Itoa(dead.Process.Pid) + ":" + uid + ":2"
	files[inUse] = false
	f, err := os.OpenFile(filepath.Join(dir, inUse), os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(4096))
	m, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	require.NoError(t, f.Close()) // the mapping alone keeps it open for writing
	defer func() { assert.NoError(t, unix.Munmap(m)) }()
	removed := reclaimShmRegions(dir)
	assert.Len(t, removed, 2)
	for name, gone := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		assert.Equal(t, gone, os.IsNotExist(err), name)
	}
}
