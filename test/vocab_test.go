package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// The error vocabulary (the case × route table in package transport's
// documentation): whatever the route, errors.Is answers one class per
// failure.

// classes are the five classes; a failure must match exactly one of them
// (none for a canceled context).
var classes = map[string]error{
	"ErrPeerGone": transport.ErrPeerGone, "ErrStaleHandle": transport.ErrStaleHandle,
	"ErrAccessDenied": transport.ErrAccessDenied, "ErrOutOfRange": transport.ErrOutOfRange,
	"ErrTimeout": transport.ErrTimeout,
}

// vocabOwner is the owner of the buffers a table case targets, on one
// route: rw (read-write), ro (read-only), wo (write-only), closed (closed
// by its owner after its handle was taken), each n bytes of a pattern.
type vocabOwner struct {
	rw, ro, wo, closed transport.RemoteBuffer
	sum                func(buf int) string // of the owner's buffer: 0 rw, 1 ro, 2 wo, 3 closed
	kill               func()               // nil: memcpy has no other process
}

func newVocabOwner(t *testing.T, route string, m *transport.Manager, n int) *vocabOwner {
	if route == "memcpy" {
		var mems [4][]byte
		var hs [4]transport.RemoteBuffer
		for i, acc := range []mr.Access{mr.ReadWrite, mr.RemoteRead, mr.RemoteWrite, mr.ReadWrite} {
			b, mem := register(t, m, n, acc)
			testpeer.Fill(mem, uint64(i+1))
			mems[i], hs[i] = mem, b.Remote()
			if i == 3 {
				require.NoError(t, b.Close())
			}
		}
		return &vocabOwner{rw: hs[0], ro: hs[1], wo: hs[2], closed: hs[3],
			sum: func(buf int) string { return testpeer.Sum(mems[buf]) }}
	}
	p := testpeer.Start(t, route)
	o := &vocabOwner{rw: p.Register(n, mr.ReadWrite, 1), ro: p.Register(n, mr.RemoteRead, 2),
		sum: func(buf int) string { return p.Sum(buf, 0, uint64(n)) }, kill: p.Kill}
	if route == testenv.RouteMem {
		// A mapping reads what it writes: no route of a mem-only owner
		// reaches a write-only buffer, and it says so. A read-only one
		// keeps the buffers' numbers.
		_, err := p.TryRegister(n, mr.RemoteWrite, 3)
		require.ErrorContains(t, err, "the mem route shares only memory peers may read")
		p.Register(n, mr.RemoteRead, 3)
	} else {
		o.wo = p.Register(n, mr.RemoteWrite, 3)
	}
	o.closed = p.Register(n, mr.ReadWrite, 4)
	p.CloseBuf(3)
	return o
}

// vocabCase is one failure, with the class it must have on each route
// (a route it does not apply to is absent), whether Retryable holds, and
// whether the provider's *progress.Error is underneath, per route (a
// route absent from underneath is not checked).
type vocabCase struct {
	name string
	// target is the handle an op of direction op ("read", "write") uses,
	// and the owner's buffer it would change.
	target     func(t *testing.T, o *vocabOwner, op string) (transport.RemoteBuffer, int)
	ctx        func() context.Context // nil: context.Background()
	want       map[string]error
	retryable  bool
	underneath map[string]bool
}

func onEveryRoute(class error) map[string]error {
	return map[string]error{"memcpy": class, "mem": class, "cma": class, "shm": class, tcp: class}
}

// tcpRefused: only tcp;ofi_rxm's owner refuses the op itself (its provider
// checks keys), and its *progress.Error stays underneath.
var tcpRefused = map[string]bool{"memcpy": false, "mem": false, "cma": false, "shm": false, tcp: true}

// noProviderError: fitransfer decides before anything reaches a provider.
var noProviderError = map[string]bool{"memcpy": false, "mem": false, "cma": false, "shm": false, tcp: false}

// vocabTable is the table of transport's package documentation.
func vocabTable(n int) []vocabCase {
	rwBuf := func(_ *testing.T, o *vocabOwner, _ string) (transport.RemoteBuffer, int) { return o.rw, 0 }
	expired := func() context.Context {
		ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		_ = cancel // the deadline already ended it
		return ctx
	}
	canceled := func() context.Context {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx
	}
	return []vocabCase{
		{name: "buffer closed by its owner",
			target: func(_ *testing.T, o *vocabOwner, _ string) (transport.RemoteBuffer, int) { return o.closed, 3 },
			want:   onEveryRoute(transport.ErrStaleHandle), underneath: tcpRefused},
		{name: "altered key",
			target: func(t *testing.T, o *vocabOwner, _ string) (transport.RemoteBuffer, int) {
				h, err := alter(t, o.rw, func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						set(e, "key", num(e["key"])^0xdead)
					}
				})
				require.NoError(t, err)
				return h, 0
			},
			want: onEveryRoute(transport.ErrStaleHandle), underneath: tcpRefused},
		{name: "no remote right (genuine handle)",
			target: func(_ *testing.T, o *vocabOwner, op string) (transport.RemoteBuffer, int) {
				if op == "write" {
					return o.ro, 1
				}
				return o.wo, 2
			},
			want: onEveryRoute(transport.ErrAccessDenied), underneath: noProviderError},
		{name: "no remote right (forged access bits)",
			target: func(t *testing.T, o *vocabOwner, op string) (transport.RemoteBuffer, int) {
				h, buf := o.wo, 2
				if op == "write" {
					h, buf = o.ro, 1
				}
				if h.IsZero() {
					return h, buf // no write-only buffer on this route
				}
				h, err := alter(t, h, func(top map[string]any, _ []map[string]any) {
					top["access"] = []string{"remote_read", "remote_write"}
				})
				require.NoError(t, err)
				return h, buf
			},
			// tcp;ofi_rxm's owner refuses the op without saying why.
			want: map[string]error{"memcpy": transport.ErrAccessDenied, "mem": transport.ErrAccessDenied, "cma": transport.ErrAccessDenied,
				"shm": transport.ErrAccessDenied, tcp: transport.ErrStaleHandle},
			underneath: tcpRefused},
		{name: "range past the buffer (altered length)",
			target: func(t *testing.T, o *vocabOwner, _ string) (transport.RemoteBuffer, int) {
				h, err := alter(t, o.rw, func(top map[string]any, _ []map[string]any) {
					set(top, "length", uint64(2*n))
					set(top, "size", uint64(2*n))
				})
				require.NoError(t, err)
				return h, 0
			},
			want: map[string]error{"memcpy": transport.ErrOutOfRange, "mem": transport.ErrOutOfRange, "cma": transport.ErrOutOfRange,
				"shm": transport.ErrOutOfRange, tcp: transport.ErrStaleHandle},
			underneath: tcpRefused},
		{name: "deadline passed", target: rwBuf, ctx: expired,
			want: onEveryRoute(transport.ErrTimeout), retryable: true, underneath: noProviderError},
		{name: "context canceled", target: rwBuf, ctx: canceled,
			want: onEveryRoute(context.Canceled), underneath: noProviderError},
		// On tcp;ofi_rxm the lost connection's *progress.Error is there
		// when rxm reports it before fitransfer's stall probe finds that
		// nothing listens: timing, so not checked there.
		{name: "owner killed", target: rwBuf,
			want:       map[string]error{"mem": transport.ErrPeerGone, "cma": transport.ErrPeerGone, "shm": transport.ErrPeerGone, tcp: transport.ErrPeerGone},
			underneath: map[string]bool{"mem": false, "cma": false, "shm": false}},
	}
}

// TestErrorVocabulary runs every case of vocabTable, reading and writing,
// on every route, with real processes and endpoints, and checks that
// errors.Is finds the case's class and no other, what Retryable says,
// whether the provider's error is underneath, and that the destination's
// bytes did not change.
func TestErrorVocabulary(t *testing.T) {
	requireRoutes(t, "memcpy", "cma", "shm", tcp)
	const n = 64 << 10
	for _, route := range allRoutes {
		t.Run(route, func(t *testing.T) {
			var opts []transport.Option
			if route != "memcpy" {
				opts = append(opts, transport.WithProviders(route))
			}
			m := newManager(t, append(opts, transport.WithTimeout(10*time.Second))...)
			o := newVocabOwner(t, route, m, n)
			local, mem := register(t, m, 2*n, mr.ReadWrite)
			first, _ := local.Slice(0, n)
			for _, c := range vocabTable(n) {
				want, applies := c.want[route]
				if !applies {
					continue
				}
				t.Run(c.name, func(t *testing.T) {
					for _, op := range []string{"read", "write"} {
						if c.name != "owner killed" || op == "read" {
							// Each op on a working connection: tcp;ofi_rxm
							// drops it after a refused op.
							require.Eventually(t, func() bool { return m.ReadInto(context.Background(), first, o.rw) == nil },
								20*time.Second, 20*time.Millisecond)
						}
						if c.name == "owner killed" && op == "read" {
							o.kill()
						}
						h, buf := c.target(t, o, op)
						if h.IsZero() {
							continue // the route has no such buffer: mem shares no write-only one
						}
						l, _ := local.Slice(0, h.Len())
						testpeer.Fill(mem, 99)
						var before string
						if op == "write" && c.name != "owner killed" { // a dead owner's memory is gone
							before = o.sum(buf)
						}
						ctx := context.Background()
						if c.ctx != nil {
							ctx = c.ctx()
						}
						start := time.Now()
						err := transfer(ctx, m, op, l, h)
						t.Logf("%s after %v: %v", op, time.Since(start).Round(time.Microsecond), err)
						require.Error(t, err)
						assert.ErrorIs(t, err, want, "%s", op)
						for name, class := range classes {
							if class != want {
								assert.False(t, errors.Is(err, class), "%s: the error is also %s", op, name)
							}
						}
						if want == transport.ErrTimeout {
							assert.ErrorIs(t, err, context.DeadlineExceeded, "%s", op)
						}
						assert.Equal(t, c.retryable, transport.Retryable(err), "%s: Retryable", op)
						var ce *progress.Error
						if want, checked := c.underneath[route]; checked {
							assert.Equal(t, want, errors.As(err, &ce), "%s: the provider's *progress.Error underneath", op)
						}
						if op == "read" {
							assert.Equal(t, testpeer.Pattern(2*n, 99), mem, "read: the local buffer changed")
						} else if before != "" {
							assert.Equal(t, before, o.sum(buf), "write: the owner's buffer changed")
						}
					}
				})
			}
		})
	}
}
