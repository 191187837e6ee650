// Package testpeer runs the owner of remote buffers in a child process,
// for tests that need a real peer: the test binary starts itself again
// with FITRANSFER_TESTPEER set, and TestMain calls MaybeRun first.
//
// The child opens a transport.Manager, registers buffers filled with a
// seeded pattern, prints their handles, and answers line-delimited JSON
// commands on stdin: sum or get a range, fill, close a buffer, register
// another, exit. StartFunc runs a function of the test package in the
// child instead, for Examples, which have no testing.TB.
package testpeer

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

const (
	envRun       = "FITRANSFER_TESTPEER"
	envProviders = "FITRANSFER_TESTPEER_PROVIDERS"
)

// Fill writes the pattern of seed into b: the same bytes in every process.
func Fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	v := r.Uint64()
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(v)
		v >>= 8
	}
}

// Pattern returns n bytes of the pattern of seed.
func Pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	Fill(b, seed)
	return b
}

// Sum is the hex SHA-256 of b.
func Sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

type request struct {
	Cmd    string `json:"cmd"`
	Op     string `json:"op"`
	Handle []byte `json:"handle"`
	Buf    int    `json:"buf"`
	Off    uint64 `json:"off"`
	Len    uint64 `json:"len"`
	Seed   uint64 `json:"seed"`
	Size   int    `json:"size"`
	Access uint8  `json:"access"`
	// Within bounds an "xfer" (its context's deadline); 0: the manager's
	// timeout.
	Within time.Duration `json:"within,omitempty"`
}

type reply struct {
	Stats  *Stats `json:"stats,omitempty"`
	Handle []byte `json:"handle,omitempty"`
	Addr   uint64 `json:"addr,omitempty"`
	Sum    string `json:"sum,omitempty"`
	Data   []byte `json:"data,omitempty"`
	Pid    int    `json:"pid,omitempty"`
	Count  int64  `json:"count,omitempty"`
	Route  string `json:"route,omitempty"`
	Err    string `json:"err,omitempty"`
}

// MaybeRun runs the child side when this process was started as one (by
// Start or StartFunc), and then exits. Call it first in TestMain.
func MaybeRun() {
	if name := os.Getenv(envFunc); name != "" {
		os.Exit(runFunc(name))
	}
	if os.Getenv(envRun) != "1" {
		return
	}
	os.Exit(child(os.Stdin, os.Stdout))
}

func child(in io.Reader, out io.Writer) int {
	enc := json.NewEncoder(out)
	fail := func(err error) int {
		_ = enc.Encode(reply{Err: err.Error()})
		return 1
	}
	var opts []transport.Option
	if p := os.Getenv(envProviders); p != "" {
		opts = append(opts, transport.WithProviders(strings.Split(p, ",")...))
	}
	m, err := transport.New(context.Background(), opts...)
	if err != nil {
		return fail(err)
	}
	defer m.Close()
	var looped atomic.Int64 // transfers the "loop" goroutines completed
	var bufs []*transport.Buffer
	var mems [][]byte
	register := func(size int, access mr.Access, seed uint64) ([]byte, uint64, error) {
		mem, err := mr.Alloc(size)
		if err != nil {
			return nil, 0, err
		}
		Fill(mem, seed)
		b, err := m.Register(mem, access)
		if err != nil {
			return nil, 0, err
		}
		bufs, mems = append(bufs, b), append(mems, mem)
		h, err := b.Remote().MarshalBinary()
		return h, uint64(mr.Addr(mem)), err
	}
	_ = enc.Encode(reply{Pid: os.Getpid()})
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		var req request
		if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
			return fail(err)
		}
		var rep reply
		var after func() // runs once the answer is out
		var err error    // this command's
		if req.Cmd != "register" && req.Cmd != "exit" && req.Cmd != "route" && (req.Buf < 0 || req.Buf >= len(bufs)) {
			rep.Err = fmt.Sprintf("no buffer %d", req.Buf)
			_ = enc.Encode(rep)
			continue
		}
		switch req.Cmd {
		case "register":
			rep.Handle, rep.Addr, err = register(req.Size, mr.Access(req.Access), req.Seed)
		case "sum":
			rep.Sum = Sum(mems[req.Buf][req.Off : req.Off+req.Len])
		case "get":
			rep.Data = mems[req.Buf][req.Off : req.Off+req.Len]
		case "fill":
			Fill(mems[req.Buf], req.Seed)
		case "close":
			err = bufs[req.Buf].Close()
		case "closefill":
			// At once after Close: a peer's write that lands later shows.
			if err = bufs[req.Buf].Close(); err == nil {
				Fill(mems[req.Buf], req.Seed)
			}
		case "xfer", "loop":
			var h transport.RemoteBuffer
			if err = h.UnmarshalBinary(req.Handle); err != nil {
				break
			}
			if h.Len() > uint64(len(mems[req.Buf])) {
				err = fmt.Errorf("handle of %d bytes, local buffer %d", h.Len(), len(mems[req.Buf]))
				break
			}
			local, _ := bufs[req.Buf].Slice(0, h.Len())
			xfer := func() error {
				ctx := context.Background()
				if req.Within > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, req.Within)
					defer cancel()
				}
				if req.Op == "write" {
					return m.WriteFrom(ctx, h, local)
				}
				return m.ReadInto(ctx, local, h)
			}
			if req.Cmd == "xfer" {
				err = xfer()
				break
			}
			// After the answer: the loop's first op may end the process
			// (a test killing it there), and the answer must be out first.
			after = func() {
				go func() {
					for xfer() == nil {
						looped.Add(1)
					}
				}()
			}
		case "route":
			var h transport.RemoteBuffer
			if err = h.UnmarshalBinary(req.Handle); err != nil {
				break
			}
			var rt transport.Route
			if rt, err = m.Route(h); err == nil {
				rep.Route = rt.Backend + ": " + rt.Reason
			}
		case "looped":
			rep.Count = looped.Load()
		case "stats":
			st := TakeStats()
			rep.Stats = &st
		case "exit":
			_ = enc.Encode(rep)
			return 0
		default:
			err = fmt.Errorf("unknown command %q", req.Cmd)
		}
		if err != nil {
			rep.Err = err.Error()
		}
		_ = enc.Encode(rep)
		if after != nil {
			after()
		}
	}
	return 0
}

// Peer is a running child owner.
type Peer struct {
	t      testing.TB
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Scanner
	Pid    int
	waitc  chan error
	reaper sync.Once // starts the goroutine that reaps the child
	addrs  []uint64
}

// Start starts a child owner restricted to providers (none: its own
// choice).
func Start(t testing.TB, providers ...string) *Peer {
	t.Helper()
	p := start(t, providers)
	p.reap()
	return p
}

// StartUnreaped is Start for a child that this process does not reap
// until the test ends: once it exits (Zombie) it stays a zombie, which
// kill(pid, 0) cannot tell from a live process.
func StartUnreaped(t testing.TB, providers ...string) *Peer {
	t.Helper()
	return start(t, providers)
}

// reap starts waiting for the child, which reaps it once it exits.
func (p *Peer) reap() {
	p.reaper.Do(func() { go func() { p.waitc <- p.cmd.Wait() }() })
}

func start(t testing.TB, providers []string) *Peer {
	t.Helper()
	for _, p := range providers {
		testenv.RequireRoute(t, p)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return startCmd(t, exec.Command(exe, "-test.run=^$"), providers)
}

// StartIn starts a child owner in network namespace ns (ip netns exec):
// another host, on the links of that namespace.
func StartIn(t testing.TB, ns string, providers ...string) *Peer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := startCmd(t, exec.Command("ip", "netns", "exec", ns, exe, "-test.run=^$"), providers)
	p.reap()
	return p
}

// StartAs starts a child owner running as user uid (and group uid): a
// copy of the test binary that user may run, in a temporary directory.
// Only root can.
func StartAs(t testing.TB, uid int, providers ...string) *Peer {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "fitransfer-peer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	copyExe := filepath.Join(dir, filepath.Base(exe))
	if err := os.WriteFile(copyExe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(copyExe, "-test.run=^$")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	p := startCmd(t, cmd, providers)
	p.reap()
	return p
}

func startCmd(t testing.TB, cmd *exec.Cmd, providers []string) *Peer {
	t.Helper()
	cmd.Env = append(os.Environ(), envRun+"=1", envProviders+"="+strings.Join(providers, ","))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Peer{t: t, cmd: cmd, in: in, out: bufio.NewScanner(outp), waitc: make(chan error, 1)}
	p.out.Buffer(make([]byte, 1<<20), 64<<20)
	t.Cleanup(p.Close)
	rep, err := p.read()
	if err != nil {
		t.Fatalf("test peer did not start: %v", err)
	}
	p.Pid = rep.Pid
	return p
}

func (p *Peer) read() (reply, error) {
	done := make(chan bool, 1)
	go func() { done <- p.out.Scan() }()
	select {
	case ok := <-done:
		if !ok {
			return reply{}, fmt.Errorf("test peer exited: %v", p.out.Err())
		}
	case <-time.After(60 * time.Second):
		return reply{}, errors.New("test peer did not answer within 60s")
	}
	var rep reply
	if err := json.Unmarshal(p.out.Bytes(), &rep); err != nil {
		return reply{}, err
	}
	if rep.Err != "" {
		return rep, errors.New(rep.Err)
	}
	return rep, nil
}

func (p *Peer) do(req request) reply {
	p.t.Helper()
	b, _ := json.Marshal(req)
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("test peer: %v", err)
	}
	rep, err := p.read()
	if err != nil {
		p.t.Fatalf("test peer %s: %v", req.Cmd, err)
	}
	return rep
}

// Stats returns the child's goroutine, file descriptor and memory figures.
func (p *Peer) Stats() Stats {
	p.t.Helper()
	return *p.do(request{Cmd: "stats"}).Stats
}

// TryRegister is Register that returns the child's error instead of
// failing the test.
func (p *Peer) TryRegister(size int, access mr.Access, seed uint64) (transport.RemoteBuffer, error) {
	p.t.Helper()
	b, _ := json.Marshal(request{Cmd: "register", Size: size, Access: uint8(access), Seed: seed})
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("test peer: %v", err)
	}
	rep, err := p.read()
	if err != nil {
		return transport.RemoteBuffer{}, err
	}
	p.addrs = append(p.addrs, rep.Addr)
	var r transport.RemoteBuffer
	return r, r.UnmarshalBinary(rep.Handle)
}

// Register makes the child register size bytes of the pattern of seed and
// returns the handle.
func (p *Peer) Register(size int, access mr.Access, seed uint64) transport.RemoteBuffer {
	p.t.Helper()
	rep := p.do(request{Cmd: "register", Size: size, Access: uint8(access), Seed: seed})
	p.addrs = append(p.addrs, rep.Addr)
	var r transport.RemoteBuffer
	if err := r.UnmarshalBinary(rep.Handle); err != nil {
		p.t.Fatalf("handle from test peer: %v", err)
	}
	return r
}

// Addr is the address of buffer buf in the child's memory.
func (p *Peer) Addr(buf int) uint64 { return p.addrs[buf] }

// Sum is the hex SHA-256 of bytes [off, off+n) of buffer buf in the child.
func (p *Peer) Sum(buf int, off, n uint64) string {
	p.t.Helper()
	return p.do(request{Cmd: "sum", Buf: buf, Off: off, Len: n}).Sum
}

// Get returns bytes [off, off+n) of buffer buf in the child.
func (p *Peer) Get(buf int, off, n uint64) []byte {
	p.t.Helper()
	return p.do(request{Cmd: "get", Buf: buf, Off: off, Len: n}).Data
}

// FillBuf refills buffer buf with the pattern of seed.
func (p *Peer) FillBuf(buf int, seed uint64) {
	p.t.Helper()
	p.do(request{Cmd: "fill", Buf: buf, Seed: seed})
}

// CloseBuf closes buffer buf in the child.
func (p *Peer) CloseBuf(buf int) {
	p.t.Helper()
	p.do(request{Cmd: "close", Buf: buf})
}

// CloseFill closes buffer buf in the child and, as soon as Close
// returned nil, fills its memory with the pattern of seed; it returns
// Close's error.
func (p *Peer) CloseFill(buf int, seed uint64) error {
	p.t.Helper()
	rep := p.do(request{Cmd: "closefill", Buf: buf, Seed: seed})
	if rep.Err != "" {
		return errors.New(rep.Err)
	}
	return nil
}

// Transfer makes the child read (op "read") the remote buffer h into its
// buffer buf, or write buf to it; it returns the child's error, or nil.
func (p *Peer) Transfer(op string, buf int, h transport.RemoteBuffer) error {
	p.t.Helper()
	return p.TransferWithin(op, buf, h, 0)
}

// TransferWithin is Transfer with a context that ends after d (0: none,
// the child's manager's timeout applies). The child's answer is awaited
// 60 s at most.
func (p *Peer) TransferWithin(op string, buf int, h transport.RemoteBuffer, d time.Duration) error {
	p.t.Helper()
	hb, err := h.MarshalBinary()
	if err != nil {
		p.t.Fatal(err)
	}
	b, _ := json.Marshal(request{Cmd: "xfer", Op: op, Buf: buf, Handle: hb, Within: d})
	if _, err := p.in.Write(append(b, '\n')); err != nil {
		p.t.Fatalf("test peer: %v", err)
	}
	_, err = p.read()
	return err
}

// Route is the child's Route toward h: its backend and reason.
func (p *Peer) Route(h transport.RemoteBuffer) string {
	p.t.Helper()
	hb, err := h.MarshalBinary()
	if err != nil {
		p.t.Fatal(err)
	}
	return p.do(request{Cmd: "route", Handle: hb}).Route
}

// WaitTransfers waits until the child's Loop transfers completed n times.
func (p *Peer) WaitTransfers(n int64) {
	p.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for p.do(request{Cmd: "looped"}).Count < n {
		if time.Now().After(deadline) {
			p.t.Fatalf("the test peer's loop did not complete %d transfers within 60s", n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Loop makes the child transfer with h over and over, in the background,
// until it is killed or a transfer fails.
func (p *Peer) Loop(op string, buf int, h transport.RemoteBuffer) {
	p.t.Helper()
	hb, err := h.MarshalBinary()
	if err != nil {
		p.t.Fatal(err)
	}
	p.do(request{Cmd: "loop", Op: op, Buf: buf, Handle: hb})
}

// Signal sends sig to the child.
func (p *Peer) Signal(sig syscall.Signal) {
	_ = p.cmd.Process.Signal(sig)
}

// Stop stops the child (SIGSTOP) and waits until the kernel reports it
// stopped.
func (p *Peer) Stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if st := p.State(); st == 'T' || st == 't' {
			return
		}
		time.Sleep(time.Millisecond)
	}
	p.t.Fatalf("test peer %d did not stop", p.Pid)
}

// State is the child's process state, as /proc/PID/stat gives it ('R',
// 'S', 'T', 'Z'...), or 0 when it cannot be read.
func (p *Peer) State() byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i > 0 && i+2 < len(s) {
		return s[i+2]
	}
	return 0
}

// Zombie kills a child started with StartUnreaped (SIGKILL) and waits
// until the kernel reports it a zombie: exited, not reaped.
func (p *Peer) Zombie() {
	p.t.Helper()
	_ = p.cmd.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for p.State() != 'Z' {
		if time.Now().After(deadline) {
			p.t.Fatalf("test peer %d is not a zombie 10 s after SIGKILL (state %q)", p.Pid, p.State())
		}
		time.Sleep(time.Millisecond)
	}
}

// Continue resumes a stopped child (SIGCONT).
func (p *Peer) Continue() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }

// Kill kills the child (SIGKILL) and waits for it to be gone.
func (p *Peer) Kill() {
	_ = p.cmd.Process.Kill()
	p.reap()
	select {
	case <-p.waitc:
		p.waitc <- nil
		removeShmRegions(p.cmd.Process.Pid)
	case <-time.After(10 * time.Second):
	}
}

// removeShmRegions deletes the shm provider's region files of a process
// that was killed (/dev/shm/PID:N:M): a process that exits normally
// removes its own, a killed one cannot, and each holds megabytes.
func removeShmRegions(pid int) {
	files, _ := filepath.Glob(fmt.Sprintf("/dev/shm/%d:*", pid))
	for _, f := range files {
		_ = os.Remove(f)
	}
}

// Close asks the child to exit and kills it if it does not.
func (p *Peer) Close() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	b, _ := json.Marshal(request{Cmd: "exit"})
	_, _ = p.in.Write(append(b, '\n'))
	_ = p.in.Close()
	p.reap()
	select {
	case <-p.waitc:
		p.waitc <- nil
		// A child whose shm endpoint was wedged exits without closing it,
		// which leaves its region behind.
		removeShmRegions(p.cmd.Process.Pid)
	case <-time.After(10 * time.Second):
		p.Kill()
	}
}
