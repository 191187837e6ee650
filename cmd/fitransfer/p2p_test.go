package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cliCommand is this test binary run as `fitransfer ARGS...`.
func cliCommand(t *testing.T, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), asCLI+"=1")
	return cmd
}

// syncLog is output collected by one goroutine and read by another.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.WriteString(s)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startServer runs `fitransfer serve` in another process on a free
// loopback port and returns its address and its output so far.
func startServer(t *testing.T, args ...string) (string, *syncLog) {
	t.Helper()
	cmd := cliCommand(t, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	cmd.Stderr = os.Stderr
	return runServer(t, cmd)
}

// runServer starts a `fitransfer serve` command (stopped at the end of
// the test if still running) and returns its address and output.
func runServer(t *testing.T, cmd *exec.Cmd) (string, *syncLog) {
	t.Helper()
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	log := &syncLog{}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "listening on ") {
				first <- sc.Text()
			}
			log.add(sc.Text() + "\n")
		}
	}()
	select {
	case l := <-first:
		return strings.Fields(l)[2], log
	case <-time.After(30 * time.Second):
		t.Fatal("server did not start")
	}
	return "", nil
}

type jsonRow struct {
	Provider    string  `json:"provider"`
	Peer        string  `json:"peer"`
	Op          string  `json:"op"`
	Bytes       uint64  `json:"bytes"`
	Iters       int     `json:"iters"`
	MBps        float64 `json:"mb_per_sec"`
	UsecPerXfer float64 `json:"usec_per_xfer"`
	P99         float64 `json:"p99_usec"`
	Verified    bool    `json:"verified"`
	Complete    bool    `json:"complete"`
}

func TestPointToPoint(t *testing.T) {
	addr, _ := startServer(t, "--size", "1m")
	for _, prov := range []string{"shm", "tcp"} {
		for _, test := range []string{"write", "read", "pingpong"} {
			t.Run(prov+"/"+test, func(t *testing.T) {
				out, stderr, code := runCLI(test, addr, "-p", prov, "-S", "8,4k,64k", "-I", "50", "-w", "2", "-v", "--json")
				require.Equal(t, exitOK, code, stderr)
				var rows []jsonRow
				require.NoError(t, json.Unmarshal([]byte(out), &rows), out)
				require.Len(t, rows, 3)
				for i, want := range []uint64{8, 4096, 65536} {
					r := rows[i]
					assert.Equal(t, want, r.Bytes)
					assert.Equal(t, test, r.Op)
					assert.Equal(t, 50, r.Iters)
					assert.Greater(t, r.MBps, 0.0)
					assert.Greater(t, r.UsecPerXfer, 0.0)
					assert.GreaterOrEqual(t, r.P99, 0.0)
					assert.True(t, r.Verified, "every byte checked")
					assert.True(t, r.Complete)
					assert.Contains(t, r.Provider, prov)
					assert.NotEmpty(t, r.Peer)
				}
				assert.Contains(t, stderr, "peer ")
			})
		}
	}
	// Text output: fabtests' columns, then the percentiles.
	out, stderr, code := runCLI("read", addr, "-S", "4k", "-I", "10")
	require.Equal(t, exitOK, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	assert.True(t, strings.HasPrefix(lines[0], "bytes   iters   total       time     MB/sec    usec/xfer   Mxfers/sec"), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "4k      10      40k     "), lines[1])
}

func TestPointToPointErrors(t *testing.T) {
	small, _ := startServer(t, "--size", "4k")
	shmOnly, _ := startServer(t, "-p", "shm")
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	require.NoError(t, err)
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := free.Addr().String()
	free.Close()

	tests := []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"refused", []string{"read", refused}, exitFail, []string{"connection refused", "is `fitransfer serve` running"}},
		{"size over the server's buffer", []string{"write", small, "-S", "64k"}, exitFail, []string{"larger than the server's 4096-byte buffer", "--size"}},
		{"pingpong needs twice the size", []string{"pingpong", small, "-S", "4k"}, exitFail, []string{"a pingpong of 4096 bytes needs twice that of the server's buffer, which has 4096 bytes", "--size 8192"}},
		{"no common provider", []string{"read", shmOnly, "-p", "tcp"}, exitFail, []string{"no route", "common -p provider"}},
		{"server never answers", []string{"read", silent.Addr().String(), "--timeout", "1s"}, exitFail, []string{"did not answer within 1s"}},
		{"bad size", []string{"read", small, "-S", "lots"}, exitUsage, []string{`bad size "lots"`}},
		{"no host", []string{"write"}, exitUsage, []string{"want one HOST[:PORT]"}},
		{"bad window", []string{"write", small, "-W", "0"}, exitUsage, []string{"-W >= 1"}},
		{"zero timeout", []string{"read", small, "--timeout", "0"}, exitUsage, []string{"--timeout 0s: want a positive duration"}},
		{"negative timeout", []string{"pingpong", small, "--timeout", "-1s"}, exitUsage, []string{"--timeout -1s: want a positive duration"}},
		{"unknown provider", []string{"read", small, "-p", "nosuch"}, exitFail, []string{`provider "nosuch"`, "see `fitransfer doctor`"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			_, stderr, code := runCLI(tt.args...)
			assert.Equal(t, tt.code, code, stderr)
			for _, w := range tt.want {
				assert.Contains(t, stderr, w)
			}
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			assert.LessOrEqual(t, strings.Count(stderr, "fitransfer doctor"), 1, "the hint once: %q", stderr)
			assert.Less(t, time.Since(start), 15*time.Second)
		})
	}
}

func TestInterruptPrintsWhatWasMeasured(t *testing.T) {
	addr, _ := startServer(t)
	cmd := cliCommand(t, "write", addr, "-p", "tcp", "-S", "4k,64k", "-I", "100000000")
	var out strings.Builder
	errb := &syncLog{}
	cmd.Stdout, cmd.Stderr = &out, logWriter{errb}
	require.NoError(t, cmd.Start())
	// The client says which peer it runs with once connected, before the
	// 4k row starts.
	require.Eventually(t, func() bool { return strings.Contains(errb.String(), " peer ") }, 30*time.Second, 10*time.Millisecond,
		"the client did not connect")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	err := cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee, "stdout %q stderr %q", out.String(), errb.String())
	assert.Equal(t, exitInterrupted, ee.ExitCode())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, "the header and the row of the size it was in: %q", out.String())
	assert.Contains(t, lines[0], "Mxfers/sec")
	assert.True(t, strings.HasPrefix(lines[1], "4k "), "the 4k row: %q", lines[1])
	assert.True(t, strings.HasSuffix(lines[1], "(interrupted)"), "the 4k row: %q", lines[1])
	assert.Contains(t, errb.String(), "interrupted; the rows above are what was measured")
}

// TestClientErrorWithinTimeout: a server that stops answering in the
// middle of a run (SIGSTOP: alive, connected, not progressing) makes the
// client fail within --timeout and a second, not after a second wait on
// its own buffer's Close.
func TestClientErrorWithinTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	for _, test := range []string{"write", "read", "pingpong"} {
		t.Run("tcp/"+test, func(t *testing.T) {
			srv := cliCommand(t, "serve", "--listen", "127.0.0.1:0", "--size", "1m", "-p", "tcp")
			srv.Stderr = os.Stderr
			addr, _ := runServer(t, srv)
			t.Cleanup(func() { _ = srv.Process.Signal(syscall.SIGCONT) })
			cli := cliCommand(t, test, addr, "-p", "tcp", "-S", "64k", "-I", "1000000000", "--timeout", timeout.String())
			var out strings.Builder
			errb := &syncLog{}
			cli.Stdout, cli.Stderr = &out, logWriter{errb}
			require.NoError(t, cli.Start())
			cliDone := make(chan error, 1)
			go func() { cliDone <- cli.Wait() }()
			require.Eventually(t, func() bool { return strings.Contains(errb.String(), " peer ") }, 30*time.Second, 10*time.Millisecond,
				"the client did not connect")

			require.NoError(t, srv.Process.Signal(syscall.SIGSTOP))
			stopped := time.Now()
			select {
			case err := <-cliDone:
				took := time.Since(stopped)
				var ee *exec.ExitError
				require.ErrorAs(t, err, &ee, "stdout %q stderr %q", out.String(), errb.String())
				assert.Equal(t, exitFail, ee.ExitCode())
				assert.Less(t, took, timeout+time.Second, "the error arrives within --timeout + 1 s: %s", errb.String())
				assert.Contains(t, errb.String(), "timed out")
			case <-time.After(30 * time.Second):
				_ = cli.Process.Signal(syscall.SIGQUIT)
				<-cliDone
				t.Fatalf("client still running 30 s after its server stopped; stderr %q", errb.String())
			}
		})
	}
}

// TestServeInterruptedMidSession: Ctrl-C on a server with a client in the
// middle of a run stops it at once; the client fails soon after, with the
// server's word first, and the server frees nothing still in use (a
// freed session buffer that a half-done transfer still wrote into crashed
// it over tcp).
func TestServeInterruptedMidSession(t *testing.T) {
	for _, prov := range []string{"shm", "tcp"} {
		for _, test := range []string{"write", "read", "pingpong"} {
			t.Run(prov+"/"+test, func(t *testing.T) {
				srv := cliCommand(t, "serve", "--listen", "127.0.0.1:0", "--size", "1m", "-p", prov)
				srvErr := &syncLog{}
				srv.Stderr = logWriter{srvErr}
				addr, _ := runServer(t, srv)
				cli := cliCommand(t, test, addr, "-p", prov, "-S", "8", "-I", "1000000000", "--timeout", "60s")
				var out strings.Builder
				errb := &syncLog{}
				cli.Stdout, cli.Stderr = &out, logWriter{errb}
				require.NoError(t, cli.Start())
				cliDone := make(chan error, 1)
				go func() { cliDone <- cli.Wait() }()
				// In session: the client names its peer once connected.
				require.Eventually(t, func() bool { return strings.Contains(errb.String(), " peer ") }, 30*time.Second, 10*time.Millisecond,
					"the client did not connect")

				require.NoError(t, srv.Process.Signal(os.Interrupt))
				srvDone := make(chan error, 1)
				go func() { srvDone <- srv.Wait() }()
				select {
				case err := <-srvDone:
					assert.NoError(t, err, "serve's exit; stderr:\n%s", srvErr)
				case <-time.After(10 * time.Second):
					_ = srv.Process.Kill()
					<-srvDone
					t.Fatalf("serve still running 10 s after Ctrl-C with a client in session; stderr:\n%s", srvErr)
				}
				assert.Contains(t, srvErr.String(), "server interrupted")
				assert.NotContains(t, srvErr.String(), "signal", "serve crashed on its way out")

				select {
				case err := <-cliDone:
					var ee *exec.ExitError
					require.ErrorAs(t, err, &ee, "stdout %q stderr %q", out.String(), errb.String())
					assert.Equal(t, 1, ee.ExitCode())
				case <-time.After(10 * time.Second):
					_ = cli.Process.Signal(syscall.SIGQUIT)
					<-cliDone
					t.Fatalf("client still running 10 s after its server went; stderr %q", errb.String())
				}
				assert.Contains(t, errb.String(), "the server ended the session (server interrupted")
				assert.Contains(t, out.String(), "(interrupted)", "the row measured so far")
			})
		}
	}
}

// logWriter is an io.Writer into a syncLog.
type logWriter struct{ l *syncLog }

func (w logWriter) Write(p []byte) (int, error) {
	w.l.add(string(p))
	return len(p), nil
}

func TestServeLogsSessions(t *testing.T) {
	addr, log := startServer(t)
	_, stderr, code := runCLI("write", addr, "-p", "tcp", "-S", "4k", "-I", "5")
	require.Equal(t, exitOK, code, stderr)
	require.Eventually(t, func() bool { return strings.Contains(log.String(), "session ended") }, 5*time.Second, 50*time.Millisecond)
	assert.Contains(t, log.String(), "write session")
	assert.Contains(t, log.String(), "client 127.0.0.1:")
}
