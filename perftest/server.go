package perftest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// listenHint is what to do about a failed listen, when it is clear.
func listenHint(err error) string {
	var dns *net.DNSError
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return " (is another server running there? pick another --listen port)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return " (no interface of this host has that address: --listen takes one of this host's addresses, or :PORT for all)"
	case errors.Is(err, syscall.EACCES):
		return " (ports below 1024 need privileges: pick another --listen port)"
	case errors.As(err, &dns):
		return " (--listen takes an address of this host, or :PORT for all)"
	}
	return ""
}

// ServerConfig is what a server gives its clients, and its limits.
type ServerConfig struct {
	Size uint64 // bytes of each session's buffer
	// Idle ends a session whose client sent nothing for that long (0:
	// DefaultIdleTimeout).
	Idle time.Duration
	// Hello bounds the wait for a client's first message (and its answer
	// to the challenge): a client that connects and says nothing holds a
	// connection no longer.
	Hello time.Duration
	// MaxSessions bounds the sessions at once; 0: no bound.
	MaxSessions int
	// MaxMemory bounds the bytes of all session buffers at once; 0: no
	// bound.
	MaxMemory uint64
	// Token, when set, is the shared secret a client must prove it holds
	// (bootstrap.Proof) before it gets anything.
	Token string
}

// maxPending bounds the clients connected and not yet admitted (each
// holds up to a frame until its hello deadline), at least.
const maxPending = 64

// Defaults of ServerConfig's limits.
const (
	DefaultHelloTimeout = 10 * time.Second
	// DefaultIdleTimeout is ServerConfig.Idle's default.
	DefaultIdleTimeout = 10 * time.Minute
	DefaultMaxSessions = 8
	DefaultMaxMemory   = 1 << 30
)

// Server answers fitransfer clients: each session gets its own buffer of
// the server's size; the server fills it, verifies it and answers
// pingpongs on request. RMA itself needs nothing from the server but its
// progress loops, which the manager runs.
type Server struct {
	m       *transport.Manager
	ln      net.Listener
	cfg     ServerConfig
	size    uint64
	shared  *transport.Buffer
	mem     []byte
	logf    func(format string, args ...any) // problems
	infof   func(format string, args ...any) // sessions
	idle    time.Duration
	wg      sync.WaitGroup
	clients atomic.Int64

	mu       sync.Mutex
	sessions map[*bootstrap.Conn]struct{} // open client connections
	stopping bool                         // ctx ended: sessions end at once
	admitted int                          // sessions holding a buffer
	inUse    uint64                       // bytes of their buffers
	// kept: bytes of session buffers whose Close failed for good (a peer
	// still copied with one, or an endpoint kept its registration): never
	// freed, so they count against MaxMemory for good. held: those whose
	// Close left ops with the provider, until they end (Released).
	kept    uint64
	held    uint64
	pending chan struct{} // a place per client not yet admitted
}

// refuse tells a client it cannot be served, and hangs up: the write
// side first, then, after reading what the client sent meanwhile (for a
// second at most), the rest — closing with unread bytes would reset the
// connection, and the client could lose the message.
func refuse(c net.Conn, err error) {
	conn := bootstrap.NewConn(c, time.Second)
	_ = conn.Send(bootstrap.Message{Type: bootstrap.TypeError, Error: err.Error()})
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		_ = tc.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, io.LimitReader(tc, 1<<20))
	}
	_ = conn.Close()
}

// ErrBusy refuses a client when the server is at --max-sessions or
// --max-memory.
var ErrBusy = errors.New("server busy")

// ErrAuth refuses a client that did not prove it holds the server's token.
var ErrAuth = errors.New("authentication failed")

// ErrInterrupted ends the sessions of a server whose Serve context ended
// (Ctrl-C on `fitransfer serve`); their clients are told so.
var ErrInterrupted = errors.New("server interrupted")

// Listen registers the server's shared buffer (cfg.Size bytes, the
// pattern of seed 0) and listens on addr.
func Listen(m *transport.Manager, addr string, cfg ServerConfig, logf, infof func(string, ...any)) (*Server, error) {
	if cfg.Hello <= 0 {
		cfg.Hello = DefaultHelloTimeout
	}
	if cfg.Idle <= 0 {
		cfg.Idle = DefaultIdleTimeout
	}
	if cfg.MaxMemory > 0 && cfg.Size > cfg.MaxMemory {
		return nil, fmt.Errorf("a session buffer of %d bytes is larger than the memory cap of %d: raise --max-memory or lower --size", cfg.Size, cfg.MaxMemory)
	}
	size := cfg.Size
	mem, err := mr.Alloc(int(size))
	if err != nil {
		return nil, err
	}
	Fill(mem, 0)
	shared, err := m.Register(mem, mr.ReadWrite)
	if err != nil {
		_ = mr.Free(mem)
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		_ = release(shared, mem)
		return nil, fmt.Errorf("listen on %s: %w%s", addr, err, listenHint(err))
	}
	return &Server{m: m, ln: ln, cfg: cfg, size: size, shared: shared, mem: mem, logf: logf, infof: infof, idle: cfg.Idle,
		pending: make(chan struct{}, max(maxPending, 4*cfg.MaxSessions))}, nil
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Handle is the shared buffer's handle (what `fitransfer serve` prints).
func (s *Server) Handle() transport.RemoteBuffer { return s.shared.Remote() }

// Serve accepts clients until ctx ends, or after the first session with
// once. A client that misbehaves gets an error message and a log line;
// the server goes on with the others.
func (s *Server) Serve(ctx context.Context, once bool) error {
	if ctx == nil {
		return errNilContext("Serve")
	}
	stop := context.AfterFunc(ctx, s.stop)
	defer stop()
	var backoff time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				s.wg.Wait()
				return ctx.Err()
			}
			// Out of file descriptors, say: the clients that hold them
			// will leave. Wait and accept again, as net/http does,
			// instead of ending the server.
			if backoff == 0 {
				backoff = 5 * time.Millisecond
				s.logf("accept: %v; retrying (connections are refused until it succeeds)", err)
			} else {
				backoff = min(2*backoff, time.Second)
			}
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			continue
		}
		if backoff != 0 {
			s.logf("accept: working again")
			backoff = 0
		}
		select {
		case s.pending <- struct{}{}:
		default:
			// Too many clients connecting at once: each holds a
			// goroutine and a frame until its hello deadline. Refuse
			// at once rather than queue them.
			go refuse(c, fmt.Errorf("%w: %d clients are connecting; try again later", ErrBusy, cap(s.pending)))
			continue
		}
		s.wg.Add(1)
		s.clients.Add(1)
		go func() {
			defer s.wg.Done()
			admitted := sync.OnceFunc(func() { <-s.pending })
			defer admitted()
			conn := bootstrap.NewConn(c, s.cfg.Hello)
			defer conn.Close()
			if !s.track(conn) {
				_ = conn.Send(bootstrap.Message{Type: bootstrap.TypeError, Error: ErrInterrupted.Error()})
				return
			}
			defer s.untrack(conn)
			if err := s.session(ctx, conn, admitted); err != nil {
				s.logf("client %s: %v", c.RemoteAddr(), err)
			}
		}()
		if once {
			s.wg.Wait()
			_ = s.ln.Close()
			return nil
		}
	}
}

// stop ends accepting and every session's reading: a session waiting for
// its client's next message returns at once.
func (s *Server) stop() {
	_ = s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
	for c := range s.sessions {
		_ = c.CloseRead()
	}
}

// track records an open session, or reports false when the server stops.
func (s *Server) track(c *bootstrap.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return false
	}
	if s.sessions == nil {
		s.sessions = make(map[*bootstrap.Conn]struct{})
	}
	s.sessions[c] = struct{}{}
	return true
}

func (s *Server) untrack(c *bootstrap.Conn) {
	s.mu.Lock()
	delete(s.sessions, c)
	s.mu.Unlock()
}

// authenticate challenges the client to prove it holds the token.
func (s *Server) authenticate(conn *bootstrap.Conn) error {
	nonce := make([]byte, bootstrap.NonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return err
	}
	if err := conn.Send(bootstrap.Message{Type: bootstrap.TypeChallenge, Nonce: nonce}); err != nil {
		return err
	}
	m, err := conn.Expect(bootstrap.TypeAuth, s.cfg.Hello)
	if err != nil {
		return fmt.Errorf("%w: no answer to the challenge (%v); the server needs a token: set --token or FITRANSFER_TOKEN", ErrAuth, err)
	}
	if !bootstrap.ProofOK(s.cfg.Token, nonce, m.Proof) {
		return fmt.Errorf("%w: wrong token; set the server's --token or FITRANSFER_TOKEN", ErrAuth)
	}
	return nil
}

// admit takes a session's place and memory, or refuses with ErrBusy.
func (s *Server) admit() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.cfg.MaxSessions > 0 && s.admitted >= s.cfg.MaxSessions:
		return fmt.Errorf("%w: %d sessions in progress (--max-sessions %d); try again later", ErrBusy, s.admitted, s.cfg.MaxSessions)
	case s.cfg.MaxMemory > 0 && s.inUse+s.kept+s.held+s.size > s.cfg.MaxMemory:
		past, after := "", "try again later"
		if s.held > 0 {
			past += fmt.Sprintf(", %d more stay with buffers of past sessions until the provider is done with the ops they left (toward stopped or unreachable peers: see the log)", s.held)
		}
		if s.kept > 0 {
			past += fmt.Sprintf(", %d more stay with buffers past sessions could not free (a peer still copied with them: see the log)", s.kept)
			after = "restart the server to get them back"
		}
		if past != "" {
			return fmt.Errorf("%w: %d sessions hold %d bytes%s, and another %d would pass --max-memory %d; %s",
				ErrBusy, s.admitted, s.inUse, past, s.size, s.cfg.MaxMemory, after)
		}
		return fmt.Errorf("%w: %d sessions hold %d bytes, and another %d would pass --max-memory %d; try again later",
			ErrBusy, s.admitted, s.inUse, s.size, s.cfg.MaxMemory)
	}
	s.admitted++
	s.inUse += s.size
	return nil
}

func (s *Server) leave() {
	s.mu.Lock()
	s.admitted--
	s.inUse -= s.size
	s.mu.Unlock()
}

// Admitted is how many sessions hold a buffer now.
func (s *Server) Admitted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.admitted
}

// Clients counts the sessions started.
func (s *Server) Clients() int64 { return s.clients.Load() }

// Close deregisters and frees the shared buffer (after Serve returned).
func (s *Server) Close() error { return release(s.shared, s.mem) }

// session serves one client; admitted is called once it is past its
// hello and admission.
func (s *Server) session(ctx context.Context, conn *bootstrap.Conn, admitted func()) error {
	fail := func(err error) error {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w: the session ended before the client was done", ErrInterrupted)
		}
		_ = conn.Send(bootstrap.Message{Type: bootstrap.TypeError, Error: err.Error()})
		return err
	}
	hello, err := conn.Expect(bootstrap.TypeHello, s.cfg.Hello)
	if err != nil && ctx.Err() != nil {
		return fail(err)
	}
	if err != nil {
		var ve *bootstrap.VersionError
		if errors.As(err, &ve) {
			return fail(err)
		}
		return fmt.Errorf("no hello: %w", err)
	}
	switch hello.Mode {
	case bootstrap.ModeRead, bootstrap.ModeWrite, bootstrap.ModePingPong:
	default:
		return fail(fmt.Errorf("unknown mode %q (read, write, pingpong)", hello.Mode))
	}
	if s.cfg.Token != "" {
		if err := s.authenticate(conn); err != nil {
			return fail(err)
		}
	}
	if err := s.admit(); err != nil {
		return fail(err)
	}
	defer s.leave()
	admitted()
	var over []string
	if hello.Address != nil {
		if over, err = s.m.AddPeer(*hello.Address); err != nil {
			return fail(err) // AddPeer added nothing
		}
		defer s.m.RemovePeer(*hello.Address) // the client's connection goes with its session
	}
	s.infof("client %s: %s session (its endpoints inserted on %v)", conn.RemoteAddr(), hello.Mode, over)
	defer s.infof("client %s: session ended", conn.RemoteAddr())
	buf, err := s.m.Alloc(int(s.size), mr.ReadWrite)
	if err != nil {
		return fail(err)
	}
	mem := buf.Bytes()
	defer func() {
		err := buf.Close()
		if err == nil {
			return
		}
		s.logf("client %s: %v", conn.RemoteAddr(), err)
		// The buffer stays, and still counts: for good when a peer still
		// copied with it (or its registration stayed on a stuck
		// endpoint), else until the provider is done with the ops this
		// session left with it (a stopped peer's).
		var inUse *transport.InUseError
		forGood := !errors.As(err, &inUse) || len(inUse.Peers) > 0
		s.mu.Lock()
		if forGood {
			s.kept += s.size
		} else {
			s.held += s.size
		}
		s.mu.Unlock()
		if !forGood {
			go func() {
				<-buf.Released()
				s.mu.Lock()
				s.held -= s.size
				s.mu.Unlock()
			}()
		}
	}()
	h, err := buf.Remote().MarshalBinary()
	if err != nil {
		return fail(err)
	}
	addr := s.m.Address()
	if err := conn.Send(bootstrap.Message{Type: bootstrap.TypeWelcome, Handle: h, Size: s.size, Address: &addr}); err != nil {
		return err
	}
	for {
		msg, err := conn.Recv(s.idle)
		if err != nil && ctx.Err() != nil {
			return fail(err)
		}
		if err != nil {
			var re *bootstrap.RemoteError
			if errors.As(err, &re) {
				return err
			}
			return fmt.Errorf("session ended: %w", err)
		}
		switch msg.Type {
		case bootstrap.TypeBye:
			return nil
		case bootstrap.TypeFill:
			Fill(mem, msg.Seed)
			err = conn.Send(bootstrap.Message{Type: bootstrap.TypeFilled})
		case bootstrap.TypeVerify:
			if msg.Offset > s.size || msg.Size > s.size-msg.Offset {
				return fail(fmt.Errorf("verify range [%d, +%d) outside the %d-byte buffer", msg.Offset, msg.Size, s.size))
			}
			bad := Mismatch(mem[msg.Offset:msg.Offset+msg.Size], msg.Seed)
			err = conn.Send(bootstrap.Message{Type: bootstrap.TypeVerified, OK: bad < 0, Mismatch: bad})
		case bootstrap.TypePingPong:
			if err := s.answerPingPong(ctx, conn, buf, hello, msg); err != nil {
				return fail(err)
			}
			err = conn.Send(bootstrap.Message{Type: bootstrap.TypeDone})
		default:
			return fail(fmt.Errorf("unexpected %q message", msg.Type))
		}
		if err != nil {
			return err
		}
	}
}

// answerPingPong is the server side of an RMA write ping-pong: the client
// writes Size bytes into the first half of the session buffer, the server
// sees the last byte change, and writes the second half into the client's
// buffer (named in the hello), Iters times. With a Seed (verification)
// it echoes the bytes it received.
func (s *Server) answerPingPong(ctx context.Context, conn *bootstrap.Conn, buf *transport.Buffer, hello, msg bootstrap.Message) error {
	size := msg.Size
	if size == 0 || size > s.size/2 { // not 2*size: a client's size may wrap it
		return fmt.Errorf("a pingpong of %d bytes needs a server buffer of twice that (this one has %d bytes: serve --size)", size, s.size)
	}
	var peer transport.RemoteBuffer
	if err := peer.UnmarshalBinary(hello.Handle); err != nil {
		return err
	}
	// The server writes where the handle says: over an IP provider, only
	// to the client's own address, so that no client can point the
	// server's traffic at a third host (or learn which of its ports are
	// open).
	rt, err := s.m.Route(peer)
	if err != nil {
		return fmt.Errorf("the pingpong buffer: %w", err)
	}
	if rt.Backend == string(fabric.BackendTCP) {
		// A name Route cannot read as an IP address is refused too: the
		// check must not be skipped on the client's word.
		client, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
		if rt.Host == "" || !net.ParseIP(rt.Host).Equal(net.ParseIP(client)) {
			return fmt.Errorf("the pingpong buffer is at %q, not at the client's address %s: serve writes only to its client", rt.Host, client)
		}
	}
	// Every answer goes where the check above looked: with the whole
	// handle, an answer would route again, and once a same-node owner
	// it named had gone, take the handle's tcp endpoint, which nobody
	// checked (a third host, from an attacker's review).
	peer = peer.Via(rt)
	poll := pollRoute(s.m, rt)
	if peer.Len() < size {
		return fmt.Errorf("client buffer of %d bytes is smaller than the %d-byte pingpong", peer.Len(), size)
	}
	dst, err := peer.Slice(0, size)
	if err != nil {
		return err
	}
	recv, err := buf.Slice(0, size)
	if err != nil {
		return err
	}
	send, err := buf.Slice(size, size)
	if err != nil {
		return err
	}
	// The client's next write is the proof that an answer landed, so
	// answers ask only that their source may be reused: over tcp the
	// client's provider then refuses one into a closed or forged buffer
	// without a word. The first is delivery complete, and such a client
	// is told at once. The same ops every round: Submit again.
	first := s.m.NewAction().WriteFrom(dst, send)
	write := s.m.NewAction().InjectComplete().WriteFrom(dst, send)
	for i := 1; i <= msg.Iters; i++ {
		mark := Marker(i)
		if err := WaitByte(ctx, recv.Bytes(), mark, 10*time.Second, poll, clientGone(conn)); err != nil {
			return fmt.Errorf("pingpong %d: %w", i, err)
		}
		if msg.Seed != 0 { // verifying: echo what arrived
			copy(send.Bytes(), recv.Bytes())
		}
		send.Bytes()[size-1] = mark
		a := write
		if i == 1 {
			a = first
		}
		if err := a.Submit(ctx); err != nil {
			return fmt.Errorf("pingpong %d: %w", i, err)
		}
	}
	// The next exchange starts from zeros: a marker left here could read
	// as its first, before the client wrote it. The client wrote its last
	// round (the loop saw it), and the last write back no longer needs
	// its source (its completion said so).
	clear(recv.Bytes())
	clear(send.Bytes())
	return nil
}

// clientGone is the server's stall check in a pingpong: the client sends
// nothing until it is done unless it gave up (its error message, or the
// end of the connection).
func clientGone(conn *bootstrap.Conn) func() error {
	return func() error {
		if conn.Pending(time.Millisecond) {
			return errors.New("the client stopped the pingpong")
		}
		return nil
	}
}
