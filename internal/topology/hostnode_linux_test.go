package topology

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// onlineNodes is /sys/devices/system/node/online ("0", "0-1"); "0" on a
// kernel without NUMA, which has no such file.
func onlineNodes(t *testing.T) string {
	b, err := os.ReadFile("/sys/devices/system/node/online")
	if os.IsNotExist(err) {
		return "0"
	}
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func TestHostNode(t *testing.T) {
	page := os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, 2*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	mem[0] = 1 // the first page is resident, the second never touched

	nodes := onlineNodes(t)
	t.Logf("online NUMA nodes: %s", nodes)

	node, err := HostNode(mem[:page])
	require.NoError(t, err)
	if nodes == "0" {
		assert.Equal(t, 0, node)
	} else {
		assert.GreaterOrEqual(t, node, 0)
	}

	heap := make([]byte, 64<<10)
	heap[0] = 1
	node, err = HostNode(heap)
	require.NoError(t, err)
	if nodes == "0" {
		assert.Equal(t, 0, node)
	}

	_, err = HostNode(mem[page:])
	assert.ErrorIs(t, err, ErrNotResident)

	_, err = HostNode(nil)
	assert.Error(t, err)
}
