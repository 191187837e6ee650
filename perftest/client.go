package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// MaxLocal bounds the client's local buffer (window × size): larger
// windows are cut for large sizes.
const MaxLocal = 1 << 30

// Config is one client run.
type Config struct {
	Server  string // host:port of `fitransfer serve`
	Manager *transport.Manager
	Mode    string   // bootstrap.ModeRead, ModeWrite or ModePingPong
	Sizes   []uint64 // transfer sizes
	Iters   int      // 0: fabtests' default per size
	Warmup  int      // warm-up ops per size
	// WarmupFor, when set, makes the warm-up last at least this long
	// too (DefaultWarmupFor). A Go process that blocked (on the
	// bootstrap connection, say) restarts its runtime's sysmon thread,
	// which then sleeps 20 us at a time for 50 wakes and backs off to
	// 10 ms over the next 20 ms or so; on a small machine each wake takes
	// a CPU from a spinning side, and a run of a few milliseconds (8 B
	// pingpongs) is that phase only (docs/PERFORMANCE.md).
	WarmupFor time.Duration
	Window    int  // ops in flight (bandwidth modes)
	Verify    bool // check every byte
	Timeout   time.Duration
	// Token is the server's shared secret, when it has one.
	Token string
	// Progress, when set, is called after each window with the ops done
	// and to do for the current size.
	Progress func(size uint64, done, total int)
	// Info, when set, gets a line naming the route and the peer.
	Info io.Writer
}

// Session is a connected client.
type Session struct {
	cfg      Config
	conn     *bootstrap.Conn
	remote   transport.RemoteBuffer
	Route    transport.Route
	Provider string

	ended *bootstrap.RemoteError // what the server said when it ended the session
}

// errNilContext is the error of a call given a nil context.
func errNilContext(call string) error {
	return fmt.Errorf("perftest.%s: nil context.Context: pass context.Background(), or a context with a deadline or a cancel", call)
}

// Connect opens a session with the server: hello (with this manager's
// address, which the server inserts), welcome (the session buffer's
// handle and the server's address, inserted here), and checks that a
// route exists.
func Connect(cfg Config, extra bootstrap.Message) (*Session, error) {
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("perftest.Connect: Config.Timeout %v: want a positive duration (the deadline of the bootstrap exchange and of each transfer)", cfg.Timeout)
	}
	conn, err := bootstrap.Dial(cfg.Server, cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w%s", cfg.Server, err, dialHint(err))
	}
	addr := cfg.Manager.Address()
	extra.Type, extra.Mode, extra.Address = bootstrap.TypeHello, cfg.Mode, &addr
	if err := conn.Send(extra); err != nil {
		conn.Close()
		return nil, fmt.Errorf("send hello to %s: %w", cfg.Server, err)
	}
	w, err := conn.Recv(cfg.Timeout)
	if err == nil && w.Type == bootstrap.TypeChallenge {
		if cfg.Token == "" {
			conn.Close()
			return nil, fmt.Errorf("server %s requires a token: set --token or FITRANSFER_TOKEN to the server's", cfg.Server)
		}
		if err = conn.Send(bootstrap.Message{Type: bootstrap.TypeAuth, Proof: bootstrap.Proof(cfg.Token, w.Nonce)}); err == nil {
			w, err = conn.Recv(cfg.Timeout)
		}
	}
	if err == nil && w.Type != bootstrap.TypeWelcome {
		err = fmt.Errorf("expected a %q message, got %q", bootstrap.TypeWelcome, w.Type)
	}
	if err != nil {
		conn.Close()
		if isTimeout(err) {
			return nil, fmt.Errorf("server %s did not answer within %v: overloaded, or the path to it is down", cfg.Server, cfg.Timeout)
		}
		return nil, fmt.Errorf("server %s: %w", cfg.Server, err)
	}
	s := &Session{cfg: cfg, conn: conn}
	if err := s.remote.UnmarshalBinary(w.Handle); err != nil {
		conn.Close()
		return nil, fmt.Errorf("server %s sent a bad handle: %w", cfg.Server, err)
	}
	if w.Address != nil {
		if _, err := cfg.Manager.AddPeer(*w.Address); err != nil {
			conn.Close()
			return nil, err
		}
	}
	s.Route, err = cfg.Manager.Route(s.remote)
	if err != nil {
		conn.Close()
		if sharesNoProvider(cfg.Manager, s.remote) {
			err = fmt.Errorf("%w; start both sides with a common -p provider", err)
		}
		return nil, err
	}
	s.Provider = s.Route.Backend
	return s, nil
}

func dialHint(err error) string {
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return " (is `fitransfer serve` running there, on that port?)"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return " (check the address, the route to it and that the link is up)"
	case isTimeout(err):
		return " (host unreachable or a firewall drops the port)"
	}
	return ""
}

// Remote is the session buffer's handle.
func (s *Session) Remote() transport.RemoteBuffer { return s.remote }

// Close says bye and closes the connection.
func (s *Session) Close() {
	_ = s.conn.Send(bootstrap.Message{Type: bootstrap.TypeBye})
	_ = s.conn.Close()
}

func (s *Session) request(m bootstrap.Message, reply string) (bootstrap.Message, error) {
	if err := s.conn.Send(m); err != nil {
		return m, err
	}
	return s.conn.Expect(reply, s.cfg.Timeout)
}

// CheckSizes refuses sizes larger than the server's buffer (a pingpong
// needs twice its size).
func (s *Session) CheckSizes() error {
	factor := uint64(1)
	if s.cfg.Mode == bootstrap.ModePingPong {
		factor = 2
	}
	for _, size := range s.cfg.Sizes {
		switch {
		case size*factor <= s.remote.Len():
		case factor == 2:
			return fmt.Errorf("a pingpong of %d bytes needs twice that of the server's buffer, which has %d bytes: start the server with --size %d or more",
				size, s.remote.Len(), size*factor)
		default:
			return fmt.Errorf("size %d is larger than the server's %d-byte buffer: start the server with --size %d or more",
				size, s.remote.Len(), size)
		}
	}
	return nil
}

// RunBandwidth measures reads or writes of each size: Warmup ops, then
// Iters ops in windows of Window (one Action each), as fi_rma_bw does.
// When ctx ends it returns the rows so far (the current one marked
// incomplete) and ctx's error.
func (s *Session) RunBandwidth(ctx context.Context) (_ []Row, err error) {
	if ctx == nil {
		return nil, errNilContext("RunBandwidth")
	}
	cfg := s.cfg
	if err := s.CheckSizes(); err != nil {
		return nil, err
	}
	maxSize := uint64(0)
	for _, size := range cfg.Sizes {
		maxSize = max(maxSize, size)
	}
	window := max(cfg.Window, 1)
	// Verified reads need a slot per op in flight; otherwise every op of
	// a window uses the same local bytes, as fabtests does.
	slots := 1
	if cfg.Verify && cfg.Mode == bootstrap.ModeRead {
		slots = window
	}
	localLen := min(uint64(slots)*maxSize, max(MaxLocal, maxSize))
	mem, err := mr.Alloc(int(localLen))
	if err != nil {
		return nil, err
	}
	local, err := cfg.Manager.Register(mem, 0)
	if err != nil {
		_ = mr.Free(mem)
		return nil, err
	}
	defer func() {
		if err != nil {
			releaseLater(local, mem)
			return
		}
		_ = release(local, mem)
	}()

	var rows []Row
	for si, size := range cfg.Sizes {
		seed := uint64(si + 1)
		win := window
		if slots > 1 {
			win = int(min(uint64(window), localLen/size))
		}
		if cfg.Verify {
			if cfg.Mode == bootstrap.ModeRead {
				if _, err := s.request(bootstrap.Message{Type: bootstrap.TypeFill, Seed: seed}, bootstrap.TypeFilled); err != nil {
					return rows, err
				}
			} else {
				Fill(mem[:size], seed)
			}
		}
		iters := cfg.Iters
		if iters <= 0 {
			iters = DefaultIters(size)
		}
		row, err := s.measure(ctx, local, mem, size, win, iters, seed)
		rows = append(rows, row)
		if err != nil {
			return rows, s.explain(ctx, err)
		}
	}
	return rows, nil
}

// measure runs one size: warm-up, then the timed windows.
func (s *Session) measure(ctx context.Context, local *transport.Buffer, mem []byte, size uint64, win, iters int, seed uint64) (Row, error) {
	cfg := s.cfg
	remote, _ := s.remote.Slice(0, size)
	distinct := cfg.Verify && cfg.Mode == bootstrap.ModeRead
	slots := make([]*transport.Buffer, win)
	for k := range slots {
		off := uint64(0)
		if distinct {
			off = uint64(k) * size
		}
		slots[k], _ = local.Slice(off, size)
	}
	a := cfg.Manager.NewAction()
	if !distinct {
		a.AllowOverlap()
	}
	window := func(n int) error {
		a.Reset()
		for k := 0; k < n; k++ {
			if cfg.Mode == bootstrap.ModeRead {
				a.ReadInto(slots[k], remote)
			} else {
				a.WriteFrom(remote, slots[k])
			}
		}
		return a.Submit(ctx)
	}
	// Past the Warmup ops, one op at a time: a window of large ops may
	// take far longer than WarmupFor (a rate-limited rail, say).
	warmStart := monoClock()
	for done := 0; done < cfg.Warmup || monoClock()-warmStart < cfg.WarmupFor; {
		n := 1
		if done < cfg.Warmup {
			n = min(win, cfg.Warmup-done)
		}
		if err := window(n); err != nil {
			return Row{Op: cfg.Mode, Provider: s.Provider, Bytes: size}, err
		}
		done += n
	}
	lat := make([]time.Duration, 0, iters)
	var elapsed time.Duration
	done := 0
	railsBefore := cfg.Manager.Rails()
	finish := func(err error) (Row, error) {
		r := newRow(cfg.Mode, s.Provider, size, done, win, elapsed, lat)
		r.Peer = s.Route.Peer
		if cfg.Verify {
			r.Rails = railDelta(railsBefore, cfg.Manager.Rails())
		}
		r.Complete = err == nil
		if err == nil && cfg.Verify {
			r.Verified, err = s.verify(size, seed)
		}
		return r, err
	}
	// One clock read a window, at its end, which is the next one's start
	// (as in pingRounds): the windows then add up to the loop's whole
	// time, as fabtests' total does, and an 8 B op does not pay for two
	// reads of its own. Work between windows that is not the transfer's
	// (verifying, reporting) reads the clock again after it.
	prev := monoClock()
	for done < iters {
		n := min(win, iters-done)
		if err := window(n); err != nil {
			return finish(err)
		}
		now := monoClock()
		d := now - prev
		elapsed += d
		for k := 0; k < n; k++ {
			lat = append(lat, d/time.Duration(n))
		}
		done += n
		if cfg.Verify && cfg.Mode == bootstrap.ModeRead {
			for k := 0; k < n; k++ {
				if bad := Mismatch(slots[k].Bytes(), seed); bad >= 0 {
					return finish(fmt.Errorf("verify: read of %d bytes differs from the server's data at offset %d", size, bad))
				}
			}
			now = monoClock()
		}
		if cfg.Progress != nil {
			cfg.Progress(size, done, iters)
			now = monoClock()
		}
		prev = now
	}
	return finish(nil)
}

// explain puts the server's own word first on a failed run: a server
// that ends a session (interrupted, or it hit an error) says why on the
// bootstrap connection before its endpoints go, while the client only
// sees its RMA fail with the peer gone. It waits briefly for such a
// message; without one, err is returned as it is.
func (s *Session) explain(ctx context.Context, err error) error {
	if err == nil || ctx.Err() != nil {
		return err
	}
	re := s.ended
	if re == nil {
		wait := explainWait
		if errors.Is(err, transport.ErrPeerGone) {
			// The server's endpoints are going: its word may come a
			// moment after the op failed (its shm region goes at the
			// signal, its message when its session notices), and a
			// connection that closes ends the wait at once.
			wait = explainGoneWait
		}
		_, rerr := s.conn.Recv(wait)
		if !errors.As(rerr, &re) {
			return err
		}
	}
	return fmt.Errorf("the server ended the session (%s): %w", re.Text, err)
}

// explainWait bounds explain's wait for the server's message;
// explainGoneWait, after an op found the server's side gone.
const (
	explainWait     = 300 * time.Millisecond
	explainGoneWait = 2 * time.Second
)

// verify asks the server whether a write left the pattern of seed.
func (s *Session) verify(size, seed uint64) (bool, error) {
	if s.cfg.Mode == bootstrap.ModeRead {
		return true, nil // every window was checked locally
	}
	m, err := s.request(bootstrap.Message{Type: bootstrap.TypeVerify, Size: size, Seed: seed}, bootstrap.TypeVerified)
	if err != nil {
		return false, err
	}
	if !m.OK {
		return false, fmt.Errorf("verify: the server's buffer differs from what was written at offset %d (of %d bytes)", m.Mismatch, size)
	}
	return true, nil
}

// sharesNoProvider reports whether the owner of r offers no provider m
// has: the fix for a missing route is then a common -p provider, and
// otherwise the route's own error says what is missing.
func sharesNoProvider(m *transport.Manager, r transport.RemoteBuffer) bool {
	for _, b := range m.Backends() {
		for _, p := range r.Providers() {
			if b.Provider == p {
				return false
			}
		}
	}
	return true
}
