package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/netlab"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

// hosts is two network namespaces joined by a veth pair: two hosts on
// one machine.
type hosts struct {
	a, b         string // namespace names
	aIP, bIP     string
	vethA, vethB string
}

// newHosts builds the namespaces (root only) and removes them at the end.
func newHosts(t *testing.T) *hosts {
	t.Helper()
	testenv.RequireRoot(t) // ip netns add
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatalf("ip (iproute2) not found: run `make deps`")
	}
	id := os.Getpid() % 100000
	h := &hosts{
		a: fmt.Sprintf("fta%d", id), b: fmt.Sprintf("ftb%d", id),
		aIP: "10.77.0.1", bIP: "10.77.0.2",
		vethA: fmt.Sprintf("fva%d", id), vethB: fmt.Sprintf("fvb%d", id),
	}
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", h.a).Run()
		_ = exec.Command("ip", "netns", "del", h.b).Run()
	})
	for _, c := range [][]string{
		{"netns", "add", h.a},
		{"netns", "add", h.b},
		{"link", "add", h.vethA, "type", "veth", "peer", "name", h.vethB},
		{"link", "set", h.vethA, "netns", h.a},
		{"link", "set", h.vethB, "netns", h.b},
		{"-n", h.a, "addr", "add", h.aIP + "/24", "dev", h.vethA},
		{"-n", h.b, "addr", "add", h.bIP + "/24", "dev", h.vethB},
		{"-n", h.a, "link", "set", h.vethA, "up"},
		{"-n", h.b, "link", "set", h.vethB, "up"},
		{"-n", h.a, "link", "set", "lo", "up"},
		{"-n", h.b, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(c, " "), err, out)
		}
	}
	return h
}

// in returns a command running fitransfer in namespace ns.
func in(ctx context.Context, ns string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, fitransferBin}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, testenv.TCPIfaceEnv+"=") { // the namespace's host talks over its veth
			cmd.Env = append(cmd.Env, kv)
		}
	}
	return cmd
}

// server is a `fitransfer serve` in a namespace and the lines it printed.
type server struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []string
	addr string
}

func (s *server) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.out, "\n")
}

func startServer(t *testing.T, ctx context.Context, ns, ip string, extra ...string) *server {
	t.Helper()
	s := &server{cmd: in(ctx, ns, append([]string{"serve", "--listen", ip + ":47580", "-p", "tcp", "-s", ip, "--size", "4m"}, extra...)...)}
	stdout, err := s.cmd.StdoutPipe()
	require.NoError(t, err)
	s.cmd.Stderr = os.Stderr
	require.NoError(t, s.cmd.Start())
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(os.Interrupt)
		_ = s.cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.mu.Lock()
			s.out = append(s.out, sc.Text())
			s.mu.Unlock()
			if strings.HasPrefix(sc.Text(), "listening on ") {
				ready <- strings.Fields(sc.Text())[2]
			}
		}
	}()
	select {
	case s.addr = <-ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("server in %s did not start: %s", ns, s.output())
	}
	return s
}

func TestTwoHostsOverTCP(t *testing.T) {
	h := newHosts(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := startServer(t, ctx, h.a, h.aIP)
	assert.Equal(t, h.aIP+":47580", srv.addr)

	for _, op := range []string{"write", "read", "pingpong"} {
		t.Run(op, func(t *testing.T) {
			cmd := in(ctx, h.b, op, srv.addr, "-p", "tcp", "-s", h.bIP, "-S", "4k,1m", "-I", "20", "-v", "--json")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, stderr.String())
			var rows []struct {
				Provider string `json:"provider"`
				Peer     string `json:"peer"`
				Bytes    uint64 `json:"bytes"`
				Verified bool   `json:"verified"`
			}
			require.NoError(t, json.Unmarshal(out, &rows), string(out))
			require.Len(t, rows, 2)
			for _, r := range rows {
				assert.Equal(t, "tcp;ofi_rxm", r.Provider)
				assert.True(t, r.Verified)
				// The peer is the other namespace's endpoint.
				assert.Contains(t, r.Peer, "fi_sockaddr_in://"+h.aIP+":", r.Peer)
			}
			assert.Contains(t, stderr.String(), "(remote)", "a namespace with its own mounts is another node")
		})
	}
	// The server saw the client at the other namespace's address.
	assert.Contains(t, srv.output(), "client "+h.bIP+":")
}

func TestUnreachableHostIsOneLine(t *testing.T) {
	h := newHosts(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, exec.Command("ip", "-n", h.a, "link", "set", h.vethA, "down").Run())
	start := time.Now()
	cmd := in(ctx, h.b, "read", h.aIP, "-p", "tcp", "-s", h.bIP, "--timeout", "5s")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 1, ee.ExitCode())
	assert.Less(t, time.Since(start), 20*time.Second)
	msg := stderr.String()
	assert.Equal(t, 1, strings.Count(msg, "\n"), msg)
	assert.Contains(t, msg, "connect to "+h.aIP)
	assert.True(t, strings.Contains(msg, "no route to host") || strings.Contains(msg, "timeout"), msg)
}

func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// linkBytes is the bytes the interface dev of namespace ns has received
// and sent.
func linkBytes(t *testing.T, ns, dev string) uint64 {
	t.Helper()
	n, err := netlab.LinkBytes(ns, dev)
	require.NoError(t, err)
	return n
}
