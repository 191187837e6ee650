package fabric

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeSysfs builds class/infiniband/<name>/device/{vendor,device} files.
func fakeSysfs(t *testing.T, devs map[string][2]string) string {
	root := t.TempDir()
	for name, vd := range devs {
		dir := filepath.Join(root, "class", "infiniband", name, "device")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "vendor"), []byte(vd[0]+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "device"), []byte(vd[1]+"\n"), 0o644))
	}
	return root
}

func TestEFADevices(t *testing.T) {
	root := fakeSysfs(t, map[string][2]string{
		"rdmap16s27": {"0x1d0f", "0xefa0"},
		"rdmap79s0":  {"0x1d0f", "0xefa1"},
		"mlx5_0":     {"0x15b3", "0x101b"},
	})
	devs, err := EFADevices(root)
	require.NoError(t, err)
	assert.Equal(t, []EFADevice{
		{Name: "rdmap16s27", PCIDevice: "0xefa0"},
		{Name: "rdmap79s0", PCIDevice: "0xefa1"},
	}, devs)

	devs, err = EFADevices(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, devs)
}
