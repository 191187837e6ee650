package perftest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// PingPongBuffer is the client side of an RMA write ping-pong: a buffer
// whose first half receives the server's writes and whose second half is
// written to the server. Register it before Connect and pass Hello() as
// Connect's extra message.
type PingPongBuffer struct {
	mem  []byte
	buf  *transport.Buffer
	half uint64
}

// NewPingPongBuffer registers 2 × the largest size of cfg.
func NewPingPongBuffer(cfg Config) (*PingPongBuffer, error) {
	half := uint64(0)
	for _, s := range cfg.Sizes {
		half = max(half, s)
	}
	mem, err := mr.Alloc(int(2 * half))
	if err != nil {
		return nil, err
	}
	// Read-write, though the server only writes: the mem route shares
	// only memory peers may read, and on it the pingpong is a memory one.
	buf, err := cfg.Manager.Register(mem, mr.ReadWrite)
	if err != nil {
		_ = mr.Free(mem)
		return nil, err
	}
	return &PingPongBuffer{mem: mem, buf: buf, half: half}, nil
}

// Hello is the hello message carrying the receive half's handle.
func (p *PingPongBuffer) Hello() bootstrap.Message {
	recv, _ := p.buf.Slice(0, p.half)
	h, _ := recv.Remote().MarshalBinary()
	return bootstrap.Message{Handle: h}
}

// Close deregisters and frees the buffer (the memory stays allocated
// when ops of an interrupted transfer still use it).
func (p *PingPongBuffer) Close() error { return release(p.buf, p.mem) }

// CloseLater is Close after a failed pingpong: it returns at once, and
// the memory is freed once no op of the failed transfer uses it.
func (p *PingPongBuffer) CloseLater() { releaseLater(p.buf, p.mem) }

// serverGone is the client's stall check: the server sends nothing
// during a pingpong unless it ends the session (with an error message,
// or by closing the connection).
func (s *Session) serverGone() error {
	if !s.conn.Pending(time.Millisecond) {
		return nil
	}
	_, err := s.conn.Recv(s.cfg.Timeout)
	if errors.As(err, &s.ended) {
		return errors.New("the server stopped answering") // explain leads with what it said
	}
	if err != nil {
		return fmt.Errorf("the server closed the session: %w", err)
	}
	return errors.New("the server sent a message in the middle of the pingpong")
}

// RunPingPong measures RMA write ping-pong latency, as ib_write_lat does:
// the client writes size bytes into the server's buffer, the server sees
// the last byte change and writes back, the client sees its own last byte
// change. usec/xfer is half a round trip (fabtests counts two transfers
// per iteration); p50/p99 are of the half round trips.
func (s *Session) RunPingPong(ctx context.Context, p *PingPongBuffer) ([]Row, error) {
	if ctx == nil {
		return nil, errNilContext("RunPingPong")
	}
	cfg := s.cfg
	if err := s.CheckSizes(); err != nil {
		return nil, err
	}
	var rows []Row
	for _, size := range cfg.Sizes {
		iters := cfg.Iters
		if iters <= 0 {
			iters = DefaultPingPongIters(size)
		}
		var seed uint64
		if cfg.Verify {
			seed = size
		}
		lat := make([]time.Duration, 0, iters)
		var elapsed time.Duration
		var done int
		var runErr error
		warm := cfg.Warmup
		if cfg.WarmupFor > 0 {
			var n int
			n, runErr = s.pingWarmup(ctx, p, size, seed)
			warm = max(warm, n)
		}
		if runErr == nil {
			elapsed, done, runErr = s.pingRounds(ctx, p, size, seed, warm, iters, &lat, true)
		}
		row := newRow("pingpong", s.Provider, size, done, 1, elapsed, lat)
		row.Peer = s.Route.Peer
		row.Complete = runErr == nil
		if runErr == nil && cfg.Verify {
			// The server echoes what it received: all but the marker.
			if bad := Mismatch(p.mem[:size-1], seed); bad >= 0 {
				runErr = fmt.Errorf("verify: pingpong of %d bytes came back different at offset %d", size, bad)
			} else {
				row.Verified = true
			}
		}
		rows = append(rows, row)
		if runErr != nil {
			return rows, s.explain(ctx, runErr)
		}
	}
	return rows, nil
}

// pingWarmup runs a short exchange of pingCalibration round trips of
// size and returns how many round trips take WarmupFor at the median
// pace it saw (bounded by maxPingWarmup).
func (s *Session) pingWarmup(ctx context.Context, p *PingPongBuffer, size, seed uint64) (int, error) {
	lat := make([]time.Duration, 0, pingCalibration)
	if _, _, err := s.pingRounds(ctx, p, size, seed, 0, pingCalibration, &lat, false); err != nil {
		return 0, err
	}
	slices.Sort(lat)
	rtt := max(2*lat[len(lat)/2], time.Nanosecond)
	return int(min(s.cfg.WarmupFor/rtt+1, maxPingWarmup)), nil
}

// pingCalibration is the round trips pingWarmup times. The marker it
// leaves in the server's buffer (Marker(31)) is not the next exchange's
// first (Marker(1)), which a server that does not clear its buffer after
// an exchange would take for the client's first write. maxPingWarmup
// bounds the warm-up it asks for.
const (
	pingCalibration = 31
	maxPingWarmup   = 1 << 22
)

// pingRounds is one exchange of warm+iters round trips of size with the
// server, the last iters timed: it appends their half round trips to
// *lat and returns their sum and count (reporting Progress when report
// is set). The exchange has ended when it returns nil (the server said
// it was done).
func (s *Session) pingRounds(ctx context.Context, p *PingPongBuffer, size, seed uint64, warm, iters int, lat *[]time.Duration, report bool) (time.Duration, int, error) {
	cfg := s.cfg
	total := warm + iters
	// Before the message: the server may answer at once (a marker left in
	// its buffer that reads as the first), and a clear after that answer
	// would leave both sides waiting for each other.
	recv := p.mem[:size]
	clear(recv)
	send, _ := p.buf.Slice(p.half, size)
	if cfg.Verify {
		Fill(send.Bytes(), seed)
	}
	if err := s.conn.Send(bootstrap.Message{Type: bootstrap.TypePingPong, Size: size, Iters: total, Seed: seed}); err != nil {
		return 0, 0, err
	}
	dst, _ := s.remote.Slice(0, size)
	// The server's answer is the proof that a write landed. The same
	// op every round: Submit again.
	write := cfg.Manager.NewAction().InjectComplete().WriteFrom(dst, send)
	poll := pollRoute(cfg.Manager, s.Route)
	var elapsed time.Duration
	done := 0
	// One clock read a round trip, at its end, which is the next
	// one's start: the round trips then add up to the loop's whole
	// time, as fabtests' total over its iterations does. A read
	// before the write and another after the wait left out the
	// time between them, one clock read and the loop's own work.
	prev := monoClock()
	for i := 1; i <= total; i++ {
		mark := Marker(i)
		send.Bytes()[size-1] = mark
		if err := write.Submit(ctx); err != nil {
			return elapsed, done, err
		}
		if err := WaitByte(ctx, recv, mark, cfg.Timeout, poll, s.serverGone); err != nil {
			return elapsed, done, fmt.Errorf("pingpong %d of %d bytes: %w", i, size, err)
		}
		now := monoClock()
		if i > warm {
			d := now - prev
			elapsed += d
			*lat = append(*lat, d/2)
			done++
			if report && cfg.Progress != nil && done%64 == 0 {
				cfg.Progress(size, done, iters)
				now = monoClock() // the report is not the next round trip's
			}
		}
		prev = now
	}
	_, err := s.conn.Expect(bootstrap.TypeDone, cfg.Timeout)
	return elapsed, done, err
}
