package transport_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// TestRememberedMemRoute: once a handle's ops take its remembered mem
// route (transport.MemoOps counts them), every change the full route
// would meet is met there too, with the same error class, and a slice of
// the handle reads and writes its own bytes.
func TestRememberedMemRoute(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const n = 4096
	type env struct {
		m     *transport.Manager
		peer  *testpeer.Peer
		local *transport.Buffer
		h     transport.RemoteBuffer
	}
	for _, tt := range []struct {
		name   string
		access mr.Access
		// change happens between the ops that took the memo and the one
		// checked, which it returns (with its context).
		change func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool)
		check  func(t *testing.T, e *env, err error)
	}{
		{"a slice reads its own bytes", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				s, err := e.h.Slice(100, 200)
				require.NoError(t, err)
				return context.Background(), s, true
			},
			func(t *testing.T, e *env, err error) {
				require.NoError(t, err)
				require.True(t, bytes.Equal(testpeer.Pattern(n, 1)[100:300], e.local.Bytes()[:200]), "the slice read other bytes")
			}},
		{"a slice writes its own bytes", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				s, err := e.h.Slice(1000, 24)
				require.NoError(t, err)
				testpeer.Fill(e.local.Bytes(), 9)
				return context.Background(), s, false
			},
			func(t *testing.T, e *env, err error) {
				require.NoError(t, err)
				want := testpeer.Pattern(n, 1)
				copy(want[1000:1024], testpeer.Pattern(24, 9))
				require.Equal(t, want, e.peer.Get(0, 0, n))
			}},
		{"the owner closed the buffer", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				e.peer.CloseBuf(0)
				return context.Background(), e.h, true
			},
			func(t *testing.T, e *env, err error) { require.ErrorIs(t, err, transport.ErrStaleHandle) }},
		{"the owner registered another buffer in its place", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				e.peer.CloseBuf(0)
				e.peer.Register(n, mr.ReadWrite, 2)
				return context.Background(), e.h, false
			},
			func(t *testing.T, e *env, err error) {
				require.ErrorIs(t, err, transport.ErrStaleHandle)
				require.Equal(t, testpeer.Pattern(n, 2), e.peer.Get(1, 0, n), "the old handle wrote into the new buffer")
			}},
		{"the owner exited", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				e.peer.Kill()
				return context.Background(), e.h, true
			},
			func(t *testing.T, e *env, err error) {
				var gone *progress.PeerGoneError
				require.ErrorAs(t, err, &gone)
			}},
		{"the local buffer was closed", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				require.NoError(t, e.local.Close())
				return context.Background(), e.h, true
			},
			func(t *testing.T, e *env, err error) { require.ErrorIs(t, err, transport.ErrBufferClosed) }},
		{"the manager was closed", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				require.NoError(t, e.m.Close())
				return context.Background(), e.h, true
			},
			func(t *testing.T, e *env, err error) { require.ErrorIs(t, err, transport.ErrClosed) }},
		{"the context is done", mr.ReadWrite,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, e.h, true
			},
			func(t *testing.T, e *env, err error) {
				var te *progress.TimeoutError
				require.ErrorAs(t, err, &te)
				require.True(t, te.NotStarted)
			}},
		{"a write with a handle that grants reading", mr.RemoteRead,
			func(t *testing.T, e *env) (context.Context, transport.RemoteBuffer, bool) {
				return context.Background(), e.h, false
			},
			func(t *testing.T, e *env, err error) {
				require.ErrorIs(t, err, transport.ErrAccessDenied)
				require.Equal(t, testpeer.Pattern(n, 1), e.peer.Get(0, 0, n))
			}},
	} {
		// Each case twice: the ops alone (ReadInto, WriteFrom), and each
		// in an Action of its own.
		for _, action := range []bool{false, true} {
			name := tt.name
			if action {
				name += " (an Action)"
			}
			t.Run(name, func(t *testing.T) {
				e := &env{m: newManager(t, transport.WithProviders(testenv.RouteMem)), peer: testpeer.Start(t, testenv.RouteMem)}
				e.h = e.peer.Register(n, tt.access, 1)
				e.local = register(t, e.m, alloc(t, n), 0)
				ctx := ctxTimeout(t, time.Minute)
				do := func(ctx context.Context, h transport.RemoteBuffer, read bool) error {
					src := e.local
					if !read {
						var err error
						src, err = e.local.Slice(0, min(h.Len(), e.local.Len()))
						require.NoError(t, err)
					}
					switch {
					case action && read:
						return e.m.NewAction().ReadInto(e.local, h).Submit(ctx)
					case action:
						return e.m.NewAction().WriteFrom(h, src).Submit(ctx)
					case read:
						return e.m.ReadInto(ctx, e.local, h)
					}
					return e.m.WriteFrom(ctx, h, src)
				}
				require.NoError(t, do(ctx, e.h, true)) // finds the route
				require.Equal(t, int64(0), transport.MemoOps(e.h), "the first read left no memo")
				require.NoError(t, do(ctx, e.h, true))
				require.Equal(t, int64(1), transport.MemoOps(e.h), "the second read did not take the remembered route")
				clear(e.local.Bytes())
				opCtx, h, read := tt.change(t, e)
				tt.check(t, e, do(opCtx, h, read))
			})
		}
	}
}

// TestMemoOfTwoManagers: two managers of one process taking turns on one
// handle both read its bytes, each over its own memo of the handle's mem
// route, and the turns allocate nothing once warm.
func TestMemoOfTwoManagers(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const n = 64
	peer := testpeer.Start(t, testenv.RouteMem)
	h := peer.Register(n, mr.ReadWrite, 3)
	want := testpeer.Pattern(n, 3)
	var ms [2]*transport.Manager
	var bufs [2]*transport.Buffer
	for i := range ms {
		ms[i] = newManager(t, transport.WithProviders(testenv.RouteMem))
		bufs[i] = register(t, ms[i], alloc(t, n), 0)
	}
	ctx := context.Background()
	var failed error
	turns := func() {
		for i := range ms {
			clear(bufs[i].Bytes())
			if err := ms[i].ReadInto(ctx, bufs[i], h); err != nil && failed == nil {
				failed = err
			}
			if !bytes.Equal(want, bufs[i].Bytes()) && failed == nil {
				failed = fmt.Errorf("manager %d read other bytes", i)
			}
		}
	}
	for range 10 {
		turns()
	}
	require.NoError(t, failed)
	before := transport.MemoOps(h)
	const runs = 200
	allocs := testing.AllocsPerRun(runs, turns) // runs once more to warm up
	require.NoError(t, failed)
	require.Equal(t, before+2*(runs+1), transport.MemoOps(h), "a manager's turn did not take its memo")
	if !testenv.RaceEnabled { // the race detector allocates for its own bookkeeping
		require.Zero(t, allocs, "allocations per pair of turns")
	}
}
