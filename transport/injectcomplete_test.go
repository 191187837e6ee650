package transport_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestInjectCompleteWrites: over every route, each write of an
// InjectComplete action lands with the bytes its source had when Submit
// was called, although the test overwrites the source as soon as Submit
// returns nil; the owner shows them within a deadline. Random sizes (from
// 1 byte to over a tcp chunk) and offsets, seeded.
func TestInjectCompleteWrites(t *testing.T) {
	const n = 3<<20 + 4096
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "TEST_SEED")
		seed = v
	}
	t.Logf("seed %d (replay with TEST_SEED=%d)", seed, seed)
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			rng := rand.New(rand.NewPCG(seed, 0))
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			h := peer.Register(n, mr.ReadWrite, 1)
			local := register(t, m, alloc(t, n), 0)
			ctx := ctxTimeout(t, time.Minute)
			a := m.NewAction().InjectComplete()
			for i := range 24 {
				size := 1 + rng.IntN(n)
				if i%2 == 0 {
					size = 1 + rng.IntN(64) // where the acknowledgement was most of the op
				}
				off := rng.IntN(n - size + 1)
				src, err := local.Slice(uint64(off), uint64(size))
				require.NoError(t, err)
				dst, err := h.Slice(uint64(off), uint64(size))
				require.NoError(t, err)
				want := testpeer.Pattern(size, uint64(100+i))
				copy(src.Bytes(), want)
				a.Reset()
				require.NoError(t, a.WriteFrom(dst, src).Submit(ctx), "write %d: %d bytes at %d (seed %d)", i, size, off, seed)
				// The source may be reused once Submit returned.
				for j := range src.Bytes() {
					src.Bytes()[j] = 0xee
				}
				wantSum := testpeer.Sum(want)
				require.Eventually(t, func() bool { return peer.Sum(0, uint64(off), uint64(size)) == wantSum },
					30*time.Second, time.Millisecond, "write %d: %d bytes at %d did not land as submitted (seed %d)", i, size, off, seed)
			}
		})
	}
}

// TestInjectCompleteRefusedWrite: a write of an InjectComplete action to
// a buffer its owner closed returns nil over tcp;ofi_rxm, as
// Action.InjectComplete documents (the owner's provider refuses it after
// the write completed), and fails with ErrStaleHandle over the same-node
// routes, whose check of the handle fails before anything is posted
// (2.0 to 2.6's shm too, where the write would otherwise complete once
// posted). Either way reads right after it of another buffer of that
// owner get their bytes — one read, four at once — although over tcp the
// refusal dropped the
// connection they were about to take.
func TestInjectCompleteRefusedWrite(t *testing.T) {
	const n = 4096
	want := testpeer.Pattern(n, 1)
	next := []struct {
		name string
		run  func(t *testing.T, m *transport.Manager, other transport.RemoteBuffer) error
	}{
		{"a read", func(t *testing.T, m *transport.Manager, other transport.RemoteBuffer) error {
			local := register(t, m, alloc(t, n), 0)
			if err := m.ReadInto(context.Background(), local, other); err != nil {
				return err
			}
			require.Equal(t, want, local.Bytes())
			return nil
		}},
		{"4 reads at once", func(t *testing.T, m *transport.Manager, other transport.RemoteBuffer) error {
			errs := make(chan error, 4)
			for range 4 {
				local := register(t, m, alloc(t, n), 0)
				go func() {
					err := m.ReadInto(context.Background(), local, other)
					if err == nil && !bytes.Equal(want, local.Bytes()) {
						err = fmt.Errorf("a read got other bytes")
					}
					errs <- err
				}()
			}
			return errors.Join(<-errs, <-errs, <-errs, <-errs)
		}},
	}
	for _, prov := range providers {
		for _, nx := range next {
			t.Run(prov+"/"+nx.name, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				m := newManager(t, transport.WithProviders(prov))
				peer := testpeer.Start(t, prov)
				other := peer.Register(n, mr.ReadWrite, 1)
				h := peer.Register(n, mr.ReadWrite, 2)
				local := register(t, m, alloc(t, n), 0)
				ctx := ctxTimeout(t, time.Minute)
				src, err := local.Slice(0, 8)
				require.NoError(t, err)
				copy(src.Bytes(), "refused!")
				// The first op connects (and on the same-node routes verifies
				// the owner), so that the refusal is the closed buffer's.
				require.NoError(t, m.NewAction().InjectComplete().WriteFrom(h, src).Submit(ctx))
				peer.CloseBuf(1)
				err = m.NewAction().InjectComplete().WriteFrom(h, src).Submit(ctx)
				if prov == testenv.RouteTCP {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, transport.ErrStaleHandle)
				}
				require.NoError(t, nx.run(t, m, other), "the ops after the refused write")
			})
		}
	}
}

// TestStaleReadAfterInjectComplete: a read of a buffer its owner closed
// fails with ErrStaleHandle after an InjectComplete write to another of
// that owner's buffers, at once and 90 and 97 ms later, late in the 100 ms
// in which an op failing on the connection counts as a victim of that
// write's possible refusal (and is posted again, to be refused again).
func TestStaleReadAfterInjectComplete(t *testing.T) {
	for _, prov := range providers {
		for _, gap := range []time.Duration{0, 90 * time.Millisecond, 97 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", prov, gap), func(t *testing.T) {
				m, live, closed, local := ownerWithClosedBuffer(t, prov)
				ctx := ctxTimeout(t, time.Minute)
				src, err := local.Slice(0, 8)
				require.NoError(t, err)
				require.NoError(t, m.NewAction().InjectComplete().WriteFrom(live, src).Submit(ctx))
				time.Sleep(gap) // the scenario's gap, not a wait for anything
				require.ErrorIs(t, m.ReadInto(ctx, local, closed), transport.ErrStaleHandle)
			})
		}
	}
}

// TestStaleOpBesideLiveOne: an action of a read of a live buffer and a
// read of a closed one, 50 and 300 ms after an earlier op on the closed
// buffer was refused, fails with ErrStaleHandle: the live read's success
// must not make the refused read look like the earlier refusal's victim.
func TestStaleOpBesideLiveOne(t *testing.T) {
	for _, prov := range providers {
		for _, gap := range []time.Duration{50 * time.Millisecond, 300 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", prov, gap), func(t *testing.T) {
				m, live, closed, l2 := ownerWithClosedBuffer(t, prov)
				l1 := register(t, m, alloc(t, 4096), 0)
				ctx := ctxTimeout(t, time.Minute)
				require.ErrorIs(t, m.ReadInto(ctx, l2, closed), transport.ErrStaleHandle)
				time.Sleep(gap) // the scenario's gap, not a wait for anything
				err := m.NewAction().ReadInto(l1, live).ReadInto(l2, closed).Submit(ctx)
				require.ErrorIs(t, err, transport.ErrStaleHandle)
			})
		}
	}
}

// ownerWithClosedBuffer starts a peer on prov with two 4 KiB buffers, and
// a manager forced onto prov with one of its own (local): it reads the
// second (closed) once, which connects (and on the same-node routes
// verifies the owner), and then has the peer close it; the first (live)
// stays.
func ownerWithClosedBuffer(t *testing.T, prov string) (m *transport.Manager, live, closed transport.RemoteBuffer, local *transport.Buffer) {
	testenv.RequireRoute(t, prov)
	m = newManager(t, transport.WithProviders(prov))
	peer := testpeer.Start(t, prov)
	live = peer.Register(4096, mr.ReadWrite, 1)
	closed = peer.Register(4096, mr.ReadWrite, 2)
	local = register(t, m, alloc(t, 4096), 0)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, closed))
	peer.CloseBuf(1)
	return m, live, closed, local
}
