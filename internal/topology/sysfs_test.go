package topology

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/topology/topotest"
)

// loadSysfs lays out testdata/<name>.sysfs (a listing: topotest.LayOut)
// in a temporary directory and returns it as a sysfs root.
func loadSysfs(t *testing.T, name string) string {
	t.Helper()
	return topotest.LayOut(t, filepath.Join("testdata", name+".sysfs"))
}

func writeFile(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
	require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
}
