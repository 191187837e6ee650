package topology

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// loadSysfs lays out testdata/<name>.sysfs in a temporary directory and
// returns it as a sysfs root. The fixtures are listings, not trees,
// because the module zip rejects ':' in file names (every sysfs PCI name
// has one): each line is "path = content" for a file or
// "path -> target" for a symlink; '#' starts a comment.
func loadSysfs(t *testing.T, name string) string {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name+".sysfs"))
	require.NoError(t, err)
	defer f.Close()
	root := t.TempDir()
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if p, target, ok := strings.Cut(line, " -> "); ok {
			symlink(t, root, p, target)
			continue
		}
		p, content, ok := strings.Cut(line, " = ")
		require.True(t, ok, "%s.sysfs:%d: want \"path = content\" or \"path -> target\"", name, n)
		writeFile(t, root, p, content+"\n")
	}
	require.NoError(t, s.Err())
	return root
}

func writeFile(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
	require.NoError(t, os.WriteFile(full, []byte(content), 0o644))
}

func symlink(t *testing.T, root, p, target string) {
	t.Helper()
	full := filepath.Join(root, p)
	require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
	require.NoError(t, os.Symlink(target, full))
}
