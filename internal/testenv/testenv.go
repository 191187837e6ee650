// Package testenv holds the requirements of tests on the machine they run
// on. A missing requirement skips a test on a developer's machine, but
// fails it under CI=true: CI declares an environment (root, CMA, the
// libfabric versions of .ci/run) in which every test runs, so a skip there
// would hide a test that never executes.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// InCI reports whether the tests run in CI (CI=true).
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips t with why, or fails it under CI=true.
func Missing(t testing.TB, why string) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s: CI runs every test, so this one must not be skipped there", why)
	}
	t.Skip(why)
}

// RequireRoot needs root (network namespaces, other users' processes).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, fmt.Sprintf("needs root, runs as uid %d", os.Geteuid()))
	}
}

// LoopbackOnly keeps libfabric's tcp provider on the loopback interface
// (FI_TCP_IFACE=lo) for this process and the processes it starts, unless
// the environment already says otherwise: tests send their traffic to
// addresses of this machine only, and to loopback wherever they can.
// Tests that run commands in network namespaces of their own take it out
// of those commands' environment.
func LoopbackOnly() {
	if _, set := os.LookupEnv(TCPIfaceEnv); !set {
		_ = os.Setenv(TCPIfaceEnv, "lo")
	}
}

// TCPIfaceEnv is libfabric's tcp provider's interface filter.
const TCPIfaceEnv = "FI_TCP_IFACE"
