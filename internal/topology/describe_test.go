package topology

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDescribe(t *testing.T) {
	t.Run("p4d.24xlarge", func(t *testing.T) {
		nics, err := Tree{Root: loadSysfs(t, "p4d.24xlarge")}.Describe(nil)
		require.NoError(t, err)
		var lines []string
		for _, n := range nics {
			lines = append(lines, n.String())
		}
		assert.Equal(t, []string{
			"0000:10:1b.0 rdmap16s27 numa 0 switch 0000:0f:00.0 with 0000:10:1c.0 0000:10:1d.0",
			"0000:20:1b.0 rdmap32s27 numa 0 switch 0000:1f:00.0 with 0000:20:1c.0 0000:20:1d.0",
			"0000:90:1b.0 rdmap144s27 numa 1 switch 0000:8f:00.0 with 0000:90:1c.0 0000:90:1d.0",
			"0000:a0:1b.0 rdmap160s27 numa 1 switch 0000:9f:00.0 with 0000:a0:1c.0 0000:a0:1d.0",
		}, lines)
	})
	t.Run("p5.48xlarge", func(t *testing.T) {
		nics, err := Tree{Root: loadSysfs(t, "p5.48xlarge")}.Describe(nil)
		require.NoError(t, err)
		require.Len(t, nics, 32)
		i := 0
		for _, sw := range p5Switches {
			for _, n := range sw.nics {
				got := nics[i]
				i++
				assert.Equal(t, n, got.Addr.String())
				assert.Equal(t, "rdmap"+strconv.Itoa(int(got.Addr.Bus))+"s0", got.Name)
				assert.Equal(t, sw.node, got.NUMANode)
				assert.Equal(t, addrs(t, sw.gpu), got.Accelerators)
				require.NotNil(t, got.Switch)
				assert.Equal(t, sw.sw, got.Switch.String())
			}
		}
		assert.Equal(t, "0000:4f:00.0 rdmap79s0 numa 0 switch 0000:45:00.0 with 0000:53:00.0", nics[0].String())
	})
	t.Run("asked-for NICs, one unknown", func(t *testing.T) {
		nics, err := Tree{Root: loadSysfs(t, "p4d.24xlarge")}.Describe(addrs(t, "0000:a0:1b.0", "0000:33:00.0"))
		require.NoError(t, err)
		require.Len(t, nics, 2)
		assert.Equal(t, "rdmap160s27", nics[0].Name)
		assert.Contains(t, nics[1].String(), "0000:33:00.0 numa unknown no accelerator behind its switch (")
		assert.Contains(t, nics[1].Err, "bus/pci/devices/0000:33:00.0")
	})
	t.Run("no sysfs", func(t *testing.T) {
		nics, err := Tree{Root: t.TempDir()}.Describe(nil)
		require.NoError(t, err)
		assert.Empty(t, nics)
	})
}
