// Package topotest lays out recorded sysfs listings (the fixtures in
// internal/topology/testdata) as real trees, for the tests of topology
// and of the packages that show its answers. It is a package of its own,
// not a test file of topology, because test files are not importable;
// and not an exported function of topology, so that test-only code stays
// out of the package the CLI links.
package topotest

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// LayOut lays out the listing at path in a temporary directory of tb and
// returns that directory, a sysfs root for topology.Tree. The fixtures
// are listings, not trees, because the module zip rejects ':' in file
// names (every sysfs PCI name has one): each line is "path = content" for
// a file or "path -> target" for a symlink; '#' starts a comment.
func LayOut(tb testing.TB, path string) string {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	root := tb.TempDir()
	s := bufio.NewScanner(f)
	for n := 1; s.Scan(); n++ {
		line := s.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		p, target, isLink := strings.Cut(line, " -> ")
		content := ""
		if !isLink {
			var ok bool
			if p, content, ok = strings.Cut(line, " = "); !ok {
				tb.Fatalf("%s:%d: want \"path = content\" or \"path -> target\"", path, n)
			}
		}
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			tb.Fatal(err)
		}
		if isLink {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(content+"\n"), 0o644)
		}
		if err != nil {
			tb.Fatalf("%s:%d: %v", path, n, err)
		}
	}
	if err := s.Err(); err != nil {
		tb.Fatal(err)
	}
	return root
}
