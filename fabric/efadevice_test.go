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
		"rdmap16s27": {"0x1d0f", "0xefa1"},
		"rdmap0s6":   {"0x1d0f", "0xefa0"},
		"mlx5_0":     {"0x15b3", "0x101b"},
	})
	devs, err := EFADevices(root)
	require.NoError(t, err)
	assert.Equal(t, []EFADevice{
		{Name: "rdmap0s6", PCIDevice: "0xefa0", ReadLikely: No},
		{Name: "rdmap16s27", PCIDevice: "0xefa1", ReadLikely: Yes},
	}, devs)

	devs, err = EFADevices(t.TempDir())
	require.NoError(t, err)
	assert.Empty(t, devs)
}

func TestEFAAbortTrap(t *testing.T) {
	gen1 := fakeSysfs(t, map[string][2]string{"rdmap0s6": {"0x1d0f", "0xefa0"}})
	p4d := fakeSysfs(t, map[string][2]string{"rdmap16s27": {"0x1d0f", "0xefa1"}})
	tests := []struct {
		env, root string
		trap      bool
	}{
		{"", gen1, false},
		{"0", gen1, false},
		{"1", gen1, true},
		{"yes", gen1, true},
		{"1", p4d, false},
		{"1", t.TempDir(), false},
	}
	for _, tt := range tests {
		t.Setenv("FI_EFA_USE_DEVICE_RDMA", tt.env)
		err := efaAbortTrapAt(tt.root)
		if !tt.trap {
			assert.NoError(t, err, "env %q", tt.env)
			continue
		}
		var trap *AbortTrapError
		require.ErrorAs(t, err, &trap)
		assert.Contains(t, err.Error(), "unset FI_EFA_USE_DEVICE_RDMA")
	}
}
