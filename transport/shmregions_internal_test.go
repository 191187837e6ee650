package transport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	removed := reclaimShmRegions(dir)
	assert.Len(t, removed, 2)
	for name, gone := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		assert.Equal(t, gone, os.IsNotExist(err), name)
	}
}
