package main

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/transport"
)

// session opens a bootstrap session the way a client does and returns
// the connection, or the server's refusal.
func session(t *testing.T, addr string) (*bootstrap.Conn, error) {
	t.Helper()
	m, err := transport.New(context.Background(), transport.WithProviders("tcp"), transport.WithSourceAddress("127.0.0.1"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	c, err := bootstrap.Dial(addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	a := m.Address()
	require.NoError(t, c.Send(bootstrap.Message{Type: bootstrap.TypeHello, Mode: bootstrap.ModeRead, Address: &a}))
	_, err = c.Expect(bootstrap.TypeWelcome, 5*time.Second)
	return c, err
}

// TestServeLimits: sessions beyond --max-sessions, or whose buffers would
// pass --max-memory, are told the server is busy and get no buffer; the
// server goes on serving, and takes a new client once a session ends.
func TestServeLimits(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		want  string
	}{
		{"max-sessions", []string{"--max-sessions", "2"}, "server busy: 2 sessions in progress (--max-sessions 2)"},
		{"max-memory", []string{"--max-memory", "128k"}, "would pass --max-memory 131072"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, _ := startServer(t, append([]string{"--size", "64k", "-p", "tcp"}, tc.flags...)...)
			first, err := session(t, addr)
			require.NoError(t, err)
			_, err = session(t, addr)
			require.NoError(t, err)
			_, err = session(t, addr)
			var re *bootstrap.RemoteError
			require.ErrorAs(t, err, &re, "a third session")
			assert.Contains(t, re.Text, tc.want)

			require.NoError(t, first.Send(bootstrap.Message{Type: bootstrap.TypeBye}))
			require.Eventually(t, func() bool {
				_, _, code := runCLI("read", addr, "-p", "tcp", "-S", "4k", "-I", "5", "-v")
				return code == exitOK
			}, 10*time.Second, 20*time.Millisecond, "a client once a session ended")
		})
	}
}

// TestServeCountsBuffersItCouldNotFree: a client on the mem route
// stopped in the middle of a copy (SIGSTOP: Ctrl-Z, a debugger) until its
// session ended keeps serve from freeing that session's buffer, for
// good (its Close gives up after --timeout: the copy may still go on).
// The buffer still counts against --max-memory: the next client is told
// the server is busy and why. Until this test serve stopped counting it,
// and clients stopped so grew its memory past the cap without bound (a
// review saw five 64 MiB buffers under a 128 MiB cap).
func TestServeCountsBuffersItCouldNotFree(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	srv := cliCommand(t, "serve", "--listen", "127.0.0.1:0", "--size", "16m", "--max-memory", "16m",
		"--idle-timeout", "3s", "--timeout", "1s") // the client sends nothing on the session while it writes: it must stop first
	srvErr := &syncLog{}
	srv.Stderr = logWriter{srvErr}
	addr, _ := runServer(t, srv)
	cli := cliCommand(t, "write", addr, "-S", "16m", "-I", "1000000000", "-W", "1")
	errb := &syncLog{}
	cli.Stderr = logWriter{errb}
	require.NoError(t, cli.Start())
	t.Cleanup(func() { _ = cli.Process.Kill(); _ = cli.Wait() })
	// Mapped: its own buffer and serve's, each a 16 MiB memfd. Its copies
	// begin then, and take most of each op from then on.
	require.Eventually(t, func() bool { return testenv.MemfdMappings(t, cli.Process.Pid, 16<<20) == 2 }, 30*time.Second, time.Millisecond,
		"the client did not map serve's buffer (the mem route): %s", errb.String())
	require.NoError(t, cli.Process.Signal(syscall.SIGSTOP))
	if !assert.Eventually(t, func() bool { return strings.Contains(srvErr.String(), "still copy with its memory") }, 30*time.Second, 10*time.Millisecond,
		"serve gives up freeing the stopped client's buffer") {
		t.Fatalf("serve said: %q; the client said: %q", srvErr.String(), errb.String())
	}
	require.NoError(t, cli.Process.Kill())
	_ = cli.Wait()

	_, stderr, code := runCLI("read", addr, "-S", "4k", "-I", "5")
	assert.NotEqual(t, exitOK, code)
	assert.Contains(t, stderr, "server busy")
	assert.Contains(t, stderr, "stay with buffers past sessions could not free")
}

// TestServeDropsSilentClients: a client that connects and says nothing is
// dropped after --hello-timeout; an idle session ends after
// --idle-timeout and gives its place back.
func TestServeDropsSilentClients(t *testing.T) {
	addr, _ := startServer(t, "--size", "64k", "-p", "tcp", "--hello-timeout", "300ms", "--idle-timeout", "500ms", "--max-sessions", "1")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = io.ReadAll(c) // the server's error line, then the end
	require.NoError(t, err, "the server closes a silent connection")
	assert.Less(t, time.Since(start), 5*time.Second)

	idle, err := session(t, addr)
	require.NoError(t, err)
	_, err = idle.Recv(10 * time.Second)
	require.Error(t, err, "the idle session ends")
	_, stderr, code := runCLI("read", addr, "-p", "tcp", "-S", "4k", "-I", "5", "-v")
	require.Equal(t, exitOK, code, "the idle session's place is free again: %s", stderr)
}

// TestServeSurvivesRunningOutOfFiles: with fewer file descriptors than
// clients, accept fails (EMFILE); serve waits and accepts again instead of
// exiting, and serves once the connections are gone.
func TestServeSurvivesRunningOutOfFiles(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command("prlimit", "--nofile=64:64", exe, "serve", "--listen", "127.0.0.1:0", "--size", "64k", "-p", "tcp")
	cmd.Env = append(os.Environ(), asCLI+"=1")
	srvErr := &syncLog{}
	cmd.Stderr = logWriter{srvErr}
	addr, _ := runServer(t, cmd)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for i := 0; i < 100; i++ {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	require.Eventually(t, func() bool { return strings.Contains(srvErr.String(), "too many open files") }, 10*time.Second, 10*time.Millisecond,
		"serve ran out of file descriptors: %s", srvErr)
	for _, c := range conns {
		_ = c.Close()
	}
	conns = nil
	require.Eventually(t, func() bool {
		_, _, code := runCLI("read", addr, "-p", "tcp", "-S", "4k", "-I", "5", "-v")
		return code == exitOK
	}, 20*time.Second, 50*time.Millisecond, "serve serves again: %s", srvErr)
	assert.NoError(t, cmd.Process.Signal(os.Interrupt))
	assert.NoError(t, cmd.Wait(), "serve exits cleanly on Ctrl-C, not on the accept errors: %s", srvErr)
}

// TestServeToken: with --token, a client without the token or with
// another gets one error line and exit status 1, and the server registers
// nothing for it; the right token (flag or FITRANSFER_TOKEN) is served.
func TestServeToken(t *testing.T) {
	addr, out := startServer(t, "--size", "64k", "-p", "tcp", "--token", "s3cret")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no token", nil, "requires a token: set --token or FITRANSFER_TOKEN"},
		{"wrong token", []string{"--token", "guess"}, "authentication failed: wrong token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runCLI(append([]string{"read", addr, "-p", "tcp", "-S", "4k", "-I", "5"}, tc.args...)...)
			assert.Equal(t, exitFail, code)
			assert.Contains(t, stderr, tc.want)
			assert.Equal(t, 1, strings.Count(strings.TrimSpace(stderr), "\n")+1, "one line: %q", stderr)
		})
	}
	assert.NotContains(t, out.String(), "session", "the server started no session for them: %s", out)
	_, stderr, code := runCLI("read", addr, "-p", "tcp", "-S", "4k", "-I", "5", "-v", "--token", "s3cret")
	require.Equal(t, exitOK, code, stderr)
	t.Setenv(tokenEnv, "s3cret")
	_, stderr, code = runCLI("write", addr, "-p", "tcp", "-S", "4k", "-I", "5", "-v")
	require.Equal(t, exitOK, code, stderr)
	require.Eventually(t, func() bool { return strings.Count(out.String(), "session (its endpoints") == 2 }, 5*time.Second, 10*time.Millisecond, out.String())
}

// TestServeDataFollowsControl: a server listening on 127.0.0.1 puts its
// tcp endpoint there too (the address clients are handed is on
// loopback), and so does a client of it (the server's pingpong writes
// reach it on loopback).
func TestServeDataFollowsControl(t *testing.T) {
	addr, out := startServer(t, "--size", "64k", "-p", "tcp")
	_, stderr, code := runCLI("pingpong", addr, "-p", "tcp", "-S", "8", "-I", "5")
	require.Equal(t, exitOK, code, stderr)
	assert.Contains(t, stderr, "peer fi_sockaddr_in://127.0.0.1:", "the server's endpoint")
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "pingpong session") }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "127.0.0.1", sourceToward(addr), "the client's endpoint")
}

// TestServeListenHostWithoutTCP: data follows control only where tcp can
// bind the listen address; a machine whose libfabric offers no tcp
// (FI_PROVIDER leaves it out) still serves, says over what, and its
// clients, which bind tcp to their own source address, read from it.
func TestServeListenHostWithoutTCP(t *testing.T) {
	cmd := cliCommand(t, "serve", "--listen", "127.0.0.1:0", "--size", "64k")
	cmd.Env = append(cmd.Env, "FI_PROVIDER=shm")
	srvErr := &syncLog{}
	cmd.Stderr = logWriter{srvErr}
	addr, out := runServer(t, cmd)
	// The line that gave addr reaches out just after.
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "listening on ") }, 5*time.Second, time.Millisecond)
	assert.Contains(t, out.String(), "-byte buffers over [mem cma shm]")
	assert.Empty(t, srvErr.String())
	for _, p := range []string{"shm", "cma", "mem"} {
		c := cliCommand(t, "read", addr, "-p", p, "-S", "4k", "-I", "5", "-v")
		c.Env = append(c.Env, "FI_PROVIDER=shm")
		b, err := c.CombinedOutput()
		require.NoError(t, err, "-p %s: %s", p, b)
	}
}

func TestParseMaxMemory(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{{"0", 0, true}, {" 0 ", 0, true}, {"1g", 1 << 30, true}, {"128k", 128 << 10, true}, {"-1", 0, false}, {"x", 0, false}} {
		got, err := parseMaxMemory(tc.in)
		if tc.ok {
			assert.NoError(t, err, tc.in)
			assert.Equal(t, tc.want, got, tc.in)
		} else {
			assert.Error(t, err, tc.in)
		}
	}
}

// TestServeRefusesNonPositiveDurations: serve's durations must be
// positive; 0 used to mean something else than its flag said (an idle
// limit of 10 s, a transfer deadline already past).
func TestServeRefusesNonPositiveDurations(t *testing.T) {
	for _, args := range [][]string{
		{"--timeout", "0"},
		{"--idle-timeout", "0"},
		{"--hello-timeout", "-1s"},
	} {
		_, stderr, code := runCLI(append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, "want a positive duration", "%v", args)
	}
}
