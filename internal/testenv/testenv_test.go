package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCMAMissing(t *testing.T) {
	dir := t.TempDir()
	scope := func(v string) string {
		p := filepath.Join(dir, "scope"+v)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, env, file, want string
	}{
		{"no yama", "", filepath.Join(dir, "absent"), ""},
		{"yama 0", "", scope("0"), ""},
		{"yama 1", "", scope("1"), "needs the cma route: yama ptrace_scope=1 forbids process_vm_readv between unrelated processes (echo 0 > " + scope("1") + ")"},
		{"yama 3", "1", scope("3"), "needs the cma route: yama ptrace_scope=3 forbids process_vm_readv between unrelated processes (echo 0 > " + scope("3") + ")"},
		{"switched off", "0", scope("0"), "needs the cma route, which FITRANSFER_CMA=0 switches off"},
	} {
		if got := cmaMissing(tc.env, tc.file); got != tc.want {
			t.Errorf("%s: cmaMissing = %q, want %q", tc.name, got, tc.want)
		}
	}
}
