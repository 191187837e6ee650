package transport_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestLiveOwnerVerifiedAgain: a manager that verifies a live same-node
// owner again — a handle's shm address disagrees with what the owner told
// (reverify), or its table of verified owners is full (evict) — ends the
// connection it verified the owner over, and the mem link to it with it.
// Mem ops toward the owner in flight then, or starting on the remembered
// route, must not fail: the owner lives, and an op that finds its link
// ended before it copied is routed again within its request. Each
// returns nil with its bytes right, and the ops after succeed.
func TestLiveOwnerVerifiedAgain(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const (
		small  = 4096
		large  = 8<<20 + 4096 // three pieces: a copy looks at the owner between them
		rounds = 6
	)
	for _, tt := range []struct {
		name  string
		provs []string
		// drop makes m verify the owner of h again, as the code does.
		drop func(t *testing.T, m *transport.Manager, h transport.RemoteBuffer, local *transport.Buffer)
	}{
		{"a handle disagrees with the owner's shm address", []string{testenv.RouteMem, testenv.RouteSHM},
			func(t *testing.T, m *transport.Manager, h transport.RemoteBuffer, local *transport.Buffer) {
				// The op on the disagreeing handle routes it (a handle as
				// received, each time): reverify, at most once per owner
				// every reverifyAfter, so ops on it until one did (the
				// link ended); each reads the owner's bytes.
				other, err := transport.OtherShmAddress(h)
				require.NoError(t, err)
				wire, err := other.MarshalBinary()
				require.NoError(t, err)
				ended, ok := transport.VerifiedMemLink(m, h)
				require.True(t, ok, "no verified owner with a mem link")
				for deadline := time.Now().Add(time.Minute); !ended(); {
					require.True(t, time.Now().Before(deadline), "no op on the disagreeing handle verified the owner again")
					var received transport.RemoteBuffer
					require.NoError(t, received.UnmarshalBinary(wire))
					clear(local.Bytes())
					require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, received))
					require.Equal(t, testpeer.Pattern(small, 1), local.Bytes(), "an op on the disagreeing handle read other bytes")
				}
			}},
		{"the table of verified owners is full", []string{testenv.RouteMem},
			func(t *testing.T, m *transport.Manager, _ transport.RemoteBuffer, _ *transport.Buffer) {
				transport.EvictVerifiedOwners(m)
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			peer := testpeer.Start(t, tt.provs...)
			m := newManager(t, transport.WithProviders(tt.provs...))
			ctx := ctxTimeout(t, 2*time.Minute)

			// The owner's buffers: 0 and 1 read, 2 and 3 written.
			hRead := peer.Register(small, mr.ReadWrite, 1)
			hReadL := peer.Register(large, mr.ReadWrite, 2)
			hWrite := peer.Register(small, mr.ReadWrite, 3)
			hWriteL := peer.Register(large, mr.ReadWrite, 4)
			wantRead, wantReadL := testpeer.Pattern(small, 1), testpeer.Pattern(large, 2)

			var (
				errMu sync.Mutex
				errs  []error
			)
			record := func(who string, err error) {
				errMu.Lock()
				defer errMu.Unlock()
				errs = append(errs, fmt.Errorf("%s: %w", who, err))
			}
			type worker struct {
				name  string
				ops   atomic.Int64 // ops that returned, whatever they returned
				h     transport.RemoteBuffer
				local *transport.Buffer
				want  []byte // a reader's: the owner's bytes
				// A writer's: the owner's buffer it writes, and the seed
				// of its last write that returned nil.
				buf    int
				lastOK uint64
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			var workers []*worker
			// A reader reads h into its buffer again and again. A routing
			// reader reads with a handle as received each time, which
			// remembers no route: each of its ops routes the handle
			// (verification, link, mapping) before it copies.
			reader := func(name string, h transport.RemoteBuffer, want []byte, routing bool) {
				w := &worker{name: name, h: h, local: register(t, m, alloc(t, len(want)), 0), want: want}
				workers = append(workers, w)
				wire, err := h.MarshalBinary()
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for !stop.Load() {
						if routing {
							h = transport.RemoteBuffer{}
							if err := h.UnmarshalBinary(wire); err != nil {
								record(name, err)
								return
							}
						}
						clear(w.local.Bytes())
						err := m.ReadInto(ctx, w.local, h)
						switch {
						case err != nil:
							record(name, err)
						case !bytes.Equal(want, w.local.Bytes()):
							record(name, errors.New("the read returned nil with other bytes"))
						}
						w.ops.Add(1)
					}
				}()
			}
			writer := func(name string, h transport.RemoteBuffer, buf, n int, seed0 uint64) {
				w := &worker{name: name, h: h, local: register(t, m, alloc(t, n), 0), buf: buf}
				workers = append(workers, w)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for seed := seed0; !stop.Load(); seed++ {
						testpeer.Fill(w.local.Bytes(), seed)
						if err := m.WriteFrom(ctx, h, w.local); err != nil {
							record(name, err)
						} else {
							w.lastOK = seed
						}
						w.ops.Add(1)
					}
				}()
			}

			// The first op verifies the owner; the workers' ops take the
			// route their handle remembers (memFast) when it still holds,
			// but the routing reader's, which route each time.
			local := register(t, m, alloc(t, small), 0)
			require.NoError(t, m.ReadInto(ctx, local, hRead))
			require.Equal(t, wantRead, local.Bytes())

			reader("small reader 1", hRead, wantRead, false)
			reader("small reader 2", hRead, wantRead, false)
			reader("large reader", hReadL, wantReadL, false)
			writer("small writer", hWrite, 2, small, 100)
			writer("large writer", hWriteL, 3, large, 1_000_000)
			reader("routing reader", hRead, wantRead, true)
			stopAll := func() {
				stop.Store(true)
				wg.Wait()
			}
			defer stopAll()

			// opsPast waits until every worker has had n more ops return
			// than it had at from: ops in flight around the drop, and
			// ops after it, each worker's.
			snapshot := func() []int64 {
				s := make([]int64, len(workers))
				for i, w := range workers {
					s[i] = w.ops.Load()
				}
				return s
			}
			opsPast := func(from []int64, n int64, what string) {
				require.Eventually(t, func() bool {
					for i, w := range workers {
						if w.ops.Load() < from[i]+n {
							return false
						}
					}
					return true
				}, time.Minute, time.Millisecond, "the workers' ops did not return (%s)", what)
			}

			for round := range rounds {
				opsPast(snapshot(), 1, "before the drop")
				ended, ok := transport.VerifiedMemLink(m, hRead)
				require.True(t, ok, "round %d: no verified owner with a mem link", round)
				require.False(t, ended(), "round %d: the link ended before the drop", round)
				tt.drop(t, m, hRead, local)
				require.Eventually(t, ended, time.Minute, time.Millisecond,
					"round %d: the mem link of the owner verified before is still up", round)
				opsPast(snapshot(), 2, "after the drop")
			}
			stopAll()

			var total int64
			for _, w := range workers {
				total += w.ops.Load()
			}
			errMu.Lock()
			defer errMu.Unlock()
			if len(errs) > 0 {
				for _, err := range errs[:min(len(errs), 3)] {
					t.Logf("failed: %v (ErrPeerGone: %v, retryable: %v)", err, errors.Is(err, transport.ErrPeerGone), transport.Retryable(err))
				}
				t.Fatalf("%d of %d ops failed while the owner lives", len(errs), total)
			}
			t.Logf("%d ops in all, none failed", total)

			// Each writer's last write landed. Then the ops after: every
			// one succeeds, with its bytes.
			for _, w := range workers {
				if w.want != nil {
					clear(w.local.Bytes())
					require.NoError(t, m.ReadInto(ctx, w.local, w.h), "%s: the op after", w.name)
					require.Equal(t, w.want, w.local.Bytes(), "%s: the op after read other bytes", w.name)
					continue
				}
				n := uint64(w.local.Len())
				require.Equal(t, testpeer.Sum(testpeer.Pattern(int(n), w.lastOK)), peer.Sum(w.buf, 0, n),
					"%s: the owner's buffer does not hold its last write", w.name)
				testpeer.Fill(w.local.Bytes(), 7)
				require.NoError(t, m.WriteFrom(ctx, w.h, w.local), "%s: the op after", w.name)
				require.Equal(t, testpeer.Sum(testpeer.Pattern(int(n), 7)), peer.Sum(w.buf, 0, n), "%s: the op after wrote other bytes", w.name)
			}

			// The owner dies, and this manager forgets it (evict) before
			// or after it sees the death: its ops fail with ErrPeerGone.
			peer.Kill()
			transport.EvictVerifiedOwners(m)
			for _, w := range workers {
				var err error
				if w.want != nil {
					err = m.ReadInto(ctx, w.local, w.h)
				} else {
					err = m.WriteFrom(ctx, w.h, w.local)
				}
				require.ErrorIs(t, err, transport.ErrPeerGone, "%s: the owner died", w.name)
			}
		})
	}
}

// TestRedoAfterCloseVerifiesNobody: a mem op whose link ended is routed
// again after its request let go of the manager; when the manager closed
// meanwhile, the op fails with ErrClosed and the manager verifies nobody
// again (a verification made then would outlive Close: its connection,
// link, pidfd and mappings).
func TestRedoAfterCloseVerifiesNobody(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	peer := testpeer.Start(t, testenv.RouteMem)
	m := newManager(t, transport.WithProviders(testenv.RouteMem))
	h := peer.Register(4096, mr.ReadWrite, 1)
	local := register(t, m, alloc(t, 4096), 0)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, h))
	redoErr, verified, err := transport.RedoAfterClose(m, local, h)
	require.NoError(t, err)
	require.ErrorIs(t, redoErr, transport.ErrClosed)
	require.Zero(t, verified, "owners verified after Close")
}

// TestVerificationChurn: ops with a good handle keep returning nil with
// their bytes while other ops make this manager verify the owner again
// and again: ops with a handle that disagrees with the owner's shm
// address (reverify, at most once per owner every reverifyAfter however
// many ops ask), or evictions from its table of verified owners in a
// loop (no limit). Each op routes its handle (as received), so each may
// meet a verification that another replaced, and takes the one that
// stands, up to maxRetake times: against the loop of evictions an op may
// fail, but only as retryable with nothing moved (an owner that asks to
// be verified again at every dial must not keep a request verifying it
// until its deadline). Until 2026-12-07 an op whose route took the new
// verification and found it replaced in turn failed with ErrNoRoute
// (final) toward a live owner, and the limit on verifying again was kept
// on the verification replaced, so that the next op with a disagreeing
// handle asked again (2,244 verifications in 5 s).
func TestVerificationChurn(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	testenv.RequireRoute(t, testenv.RouteSHM)
	const (
		n       = 4096
		readers = 4
		ops     = 300 // each reader's
	)
	for _, churn := range []string{"handles that disagree", "evictions"} {
		t.Run(churn, func(t *testing.T) {
			provs := []string{testenv.RouteMem, testenv.RouteSHM}
			peer := testpeer.Start(t, provs...)
			m := newManager(t, transport.WithProviders(provs...))
			ctx := ctxTimeout(t, 2*time.Minute)
			h := peer.Register(n, mr.ReadWrite, 1)
			want := testpeer.Pattern(n, 1)
			other, err := transport.OtherShmAddress(h)
			require.NoError(t, err)
			start := time.Now()

			var failed, retried, succeeded atomic.Int64
			var firstMu sync.Mutex
			var first []string
			fail := func(who string, err error) {
				failed.Add(1)
				firstMu.Lock()
				defer firstMu.Unlock()
				if len(first) < 3 {
					first = append(first, fmt.Sprintf("%s: %v (retryable: %v)", who, err, transport.Retryable(err)))
				}
			}
			// read reads h, as received, into local until done says so.
			read := func(who string, h transport.RemoteBuffer, local *transport.Buffer, done func(i int) bool) {
				wire, err := h.MarshalBinary()
				if err != nil {
					fail(who, err)
					return
				}
				for i := 0; !done(i); i++ {
					var received transport.RemoteBuffer
					if err := received.UnmarshalBinary(wire); err != nil {
						fail(who, err)
						return
					}
					clear(local.Bytes())
					err := m.ReadInto(ctx, local, received)
					switch {
					case err == nil && bytes.Equal(want, local.Bytes()):
						succeeded.Add(1)
					case err == nil:
						fail(who, errors.New("nil with other bytes"))
					case churn == "evictions" && transport.Retryable(err) && !errors.Is(err, transport.ErrNoRoute) &&
						bytes.Equal(make([]byte, n), local.Bytes()):
						retried.Add(1) // verified again maxRetake times while it routed: nothing moved
					default:
						fail(who, err)
					}
				}
			}

			var stop atomic.Bool
			var churners sync.WaitGroup
			for i := range readers {
				local := register(t, m, alloc(t, n), 0) // here: t's checks must not run in the goroutines
				churners.Add(1)
				go func() {
					defer churners.Done()
					if churn == "evictions" {
						if i == 0 {
							for !stop.Load() {
								transport.EvictVerifiedOwners(m)
							}
						}
						return
					}
					read(fmt.Sprintf("disagreeing reader %d", i), other, local, func(int) bool { return stop.Load() })
				}()
			}
			var good sync.WaitGroup
			for i := range readers {
				local := register(t, m, alloc(t, n), 0)
				good.Add(1)
				go func() {
					defer good.Done()
					read(fmt.Sprintf("reader %d", i), h, local, func(i int) bool { return i == ops })
				}()
			}
			good.Wait()
			stop.Store(true)
			churners.Wait()
			took := time.Since(start)

			firstMu.Lock()
			defer firstMu.Unlock()
			runs := transport.VerificationsRun(m)
			t.Logf("%d verifications in %v; %d ops returned nil, %d failed as retryable", runs, took.Round(time.Millisecond), succeeded.Load(), retried.Load())
			require.Zero(t, failed.Load(), "ops failed otherwise while the owner lives: %v", first)
			if churn == "handles that disagree" {
				// The first, and one every reverifyAfter (a second) since.
				require.LessOrEqual(t, runs, uint64(2+took/time.Second), "verifications in %v", took)
			}
		})
	}
}
