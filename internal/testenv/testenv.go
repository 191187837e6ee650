// Package testenv holds the requirements of tests on the machine they run
// on. A missing requirement skips a test on a developer's machine, but
// fails it under CI=true: CI declares an environment (root, CMA, the
// libfabric versions of .ci/run) in which every test runs, so a skip there
// would hide a test that never executes.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/mr"
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

// RequireTool needs the command name on PATH (make deps installs it), and
// returns its path.
func RequireTool(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Missing(t, fmt.Sprintf("needs %s on PATH (make deps installs it)", name))
	}
	return path
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

// The routes a transfer to another process takes, as the provider names
// tests force them with (transport.WithProviders): fitransfer's mapped
// memfds, its own process_vm_readv/writev path, libfabric's shm, and
// libfabric's tcp under rxm. mem and cma are fitransfer's code, on every
// libfabric version.
const (
	RouteMem = "mem"
	RouteCMA = "cma"
	RouteSHM = "shm"
	RouteTCP = "tcp;ofi_rxm"
)

// Routes lists every route, each of which a provider matrix runs in
// turn. It leaves none out: a subtest calls RequireRoute, so that a
// route this machine lacks shows as a skip with its reason (a failure
// under CI=true), never as a subtest that is not there.
func Routes() []string { return []string{RouteMem, RouteCMA, RouteSHM, RouteTCP} }

// RequireRoute needs what route needs on this machine: cma, RequireCMA;
// shm and tcp;ofi_rxm come with libfabric.
func RequireRoute(t testing.TB, route string) {
	t.Helper()
	if route == RouteCMA {
		RequireCMA(t)
	}
	if route == RouteMem {
		if ok, why := mr.Shares(); !ok {
			Missing(t, "needs the mem route: "+why)
		}
	}
}

// RequireCMA needs the cma route: process_vm_readv/writev between
// unrelated processes of one user, which the yama LSM forbids at
// ptrace_scope above 0 (Ubuntu's default is 1), and which
// FITRANSFER_CMA=0 switches off.
func RequireCMA(t testing.TB) {
	t.Helper()
	if why := cmaMissing(os.Getenv("FITRANSFER_CMA"), yamaScope); why != "" {
		Missing(t, why)
	}
}

// yamaScope is the yama LSM's ptrace restriction; the file is absent
// without yama.
const yamaScope = "/proc/sys/kernel/yama/ptrace_scope"

// cmaMissing says why the cma route cannot run, given FITRANSFER_CMA's
// value and yama's ptrace_scope file, or "" when it can.
func cmaMissing(cmaEnv, scopeFile string) string {
	if cmaEnv == "0" {
		return "needs the cma route, which FITRANSFER_CMA=0 switches off"
	}
	if b, err := os.ReadFile(scopeFile); err == nil {
		if scope := strings.TrimSpace(string(b)); scope != "0" {
			return "needs the cma route: yama ptrace_scope=" + scope +
				" forbids process_vm_readv between unrelated processes (echo 0 > " + scopeFile + ")"
		}
	}
	return ""
}

// MemfdMappings counts the mappings of fitransfer's memfds (mr.Alloc's)
// of size bytes in process pid: a test's readiness signal that a process
// mapped a buffer (the mem route), or let it go.
func MemfdMappings(t testing.TB, pid int, size uint64) int {
	t.Helper()
	maps, err := proc.ReadMaps(pid)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range maps {
		if strings.HasPrefix(m.Path, "/memfd:fitransfer") && m.End-m.Start == size {
			n++
		}
	}
	return n
}
