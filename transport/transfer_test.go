package transport_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

func TestReadWriteBetweenProcesses(t *testing.T) {
	sizes := []struct {
		name string
		n    int
		off  int // offset in both the local and the remote buffer
	}{
		{"1B", 1, 0},
		{"4097B-odd-offset", 4097, 13},
		{"1MiB", 1 << 20, 0},
		{"64MiB", 64 << 20, 0},
		{"256MiB", 256 << 20, 0},
	}
	if testing.Short() {
		sizes = sizes[:3]
	}
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			for i, sz := range sizes {
				t.Run(sz.name, func(t *testing.T) {
					total := sz.n + sz.off
					seed := uint64(100 + i)
					remote := peer.Register(total, mr.ReadWrite, seed)
					src, err := remote.Slice(uint64(sz.off), uint64(sz.n))
					require.NoError(t, err)
					mem := alloc(t, total)
					local := register(t, m, mem, 0)
					dst, err := local.Slice(uint64(sz.off), uint64(sz.n))
					require.NoError(t, err)

					// Read: the peer's pattern arrives byte for byte.
					ctx := ctxTimeout(t, 2*time.Minute)
					start := time.Now()
					require.NoError(t, m.ReadInto(ctx, dst, src))
					t.Logf("read %d bytes over %s in %v", sz.n, prov, time.Since(start))
					want := testpeer.Pattern(total, seed)
					require.True(t, bytes.Equal(want[sz.off:], dst.Bytes()), "read data differs")
					require.True(t, allZero(mem[:sz.off]), "read wrote before the slice")

					// Write a new pattern; the peer's memory must hold it.
					testpeer.Fill(mem, seed+1000)
					start = time.Now()
					require.NoError(t, m.WriteFrom(ctx, src, dst))
					t.Logf("wrote %d bytes over %s in %v", sz.n, prov, time.Since(start))
					require.Equal(t, testpeer.Sum(mem[sz.off:]), peer.Sum(i, uint64(sz.off), uint64(sz.n)), "written data differs")
					require.Equal(t, testpeer.Sum(want[:sz.off]), peer.Sum(i, 0, uint64(sz.off)), "write touched bytes before the slice")
				})
			}
		})
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func TestSameManagerIsMemcpy(t *testing.T) {
	m := newManager(t)
	a, b := alloc(t, 8192), alloc(t, 8192)
	testpeer.Fill(a, 7)
	ba := register(t, m, a, mr.ReadWrite)
	bb := register(t, m, b, mr.ReadWrite)
	r, err := m.Route(ba.Remote())
	require.NoError(t, err)
	assert.Equal(t, "memcpy", r.Backend)

	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, m.ReadInto(ctx, bb, ba.Remote()))
	assert.Equal(t, a, b)
	testpeer.Fill(b, 8)
	half, err := bb.Slice(100, 4000)
	require.NoError(t, err)
	dst, err := ba.Remote().Slice(10, 4000)
	require.NoError(t, err)
	require.NoError(t, m.WriteFrom(ctx, dst, half))
	assert.Equal(t, b[100:4100], a[10:4010])
}

// TestLongCopyEndsAtManagerTimeout: a copy longer than a piece looks at
// the request's deadline between pieces, and with the manager's timeout
// passed it ends with a timeout counted from the request — not one whose
// clock was never read (an op in one piece reads none).
func TestLongCopyEndsAtManagerTimeout(t *testing.T) {
	m := newManager(t, transport.WithTimeout(time.Nanosecond))
	const n = 12 << 20 // three pieces
	src := register(t, m, alloc(t, n), mr.ReadWrite)
	dst := register(t, m, alloc(t, n), mr.ReadWrite)
	start := time.Now()
	err := m.ReadInto(context.Background(), dst, src.Remote())
	var te *progress.TimeoutError
	require.ErrorAs(t, err, &te)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.LessOrEqual(t, te.After, time.Since(start), "the timeout's age, from the request")
	small, err := dst.Slice(0, 8)
	require.NoError(t, err)
	from, err := src.Remote().Slice(0, 8)
	require.NoError(t, err)
	require.NoError(t, m.ReadInto(context.Background(), small, from), "an op in one piece never looks at its deadline")
}

// TestTwoManagersOfOneProcess: a handle of another manager of this
// process is a copy checked against that manager's record — never a
// same-node route toward this very process.
func TestTwoManagersOfOneProcess(t *testing.T) {
	owner, user := newManager(t), newManager(t)
	src, ro := alloc(t, 4096), alloc(t, 4096)
	testpeer.Fill(src, 3)
	testpeer.Fill(ro, 4)
	bsrc := register(t, owner, src, mr.ReadWrite)
	bro := register(t, owner, ro, mr.RemoteRead)
	dst := register(t, user, alloc(t, 4096), mr.ReadWrite)
	r, err := user.Route(bsrc.Remote())
	require.NoError(t, err)
	assert.Equal(t, "memcpy", r.Backend)
	assert.Equal(t, "the buffer belongs to another manager of this process", r.Reason)

	ctx := ctxTimeout(t, 10*time.Second)
	require.NoError(t, user.ReadInto(ctx, dst, bsrc.Remote()))
	assert.Equal(t, src, dst.Bytes())
	assert.ErrorIs(t, user.WriteFrom(ctx, bro.Remote(), dst), transport.ErrAccessDenied)
	assert.Equal(t, testpeer.Pattern(4096, 4), ro, "a read-only buffer of the other manager was written")
	h := bsrc.Remote()
	require.NoError(t, bsrc.Close())
	assert.ErrorIs(t, user.ReadInto(ctx, dst, h), transport.ErrStaleHandle)
}

func TestRouting(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem) // the default same-node route it expects
	m := newManager(t)
	bs := m.Backends()
	require.NotEmpty(t, bs)
	assert.Equal(t, "mem", bs[0].Provider, "buffers from mr.Alloc are shared with verified peers")
	copyRoute := bs[1].Provider // cma where process_vm_readv reaches peers, else shm
	assert.Contains(t, []string{"cma", "shm"}, copyRoute)
	for _, b := range bs {
		assert.NotEmpty(t, b.Reason)
		assert.NotEmpty(t, b.Address)
	}
	peer := testpeer.Start(t)
	h := peer.Register(4096, mr.ReadWrite, 1)
	r, err := m.Route(h)
	require.NoError(t, err)
	assert.Equal(t, "mem", r.Backend, r.Reason)

	// A buffer peers may only write is not shared (a mapping could read
	// it): it is reached by a copy route.
	r, err = m.Route(peer.Register(4096, mr.RemoteWrite, 1))
	require.NoError(t, err)
	assert.Equal(t, copyRoute, r.Backend, r.Reason)

	// A peer with shm only is reached over shm.
	shmPeer := testpeer.Start(t, "shm")
	r, err = m.Route(shmPeer.Register(4096, mr.ReadWrite, 1))
	require.NoError(t, err)
	assert.Equal(t, "shm", r.Backend, r.Reason)

	// A peer with tcp only is reached over tcp even on this node.
	tcpPeer := testpeer.Start(t, "tcp;ofi_rxm")
	h = tcpPeer.Register(4096, mr.ReadWrite, 1)
	r, err = m.Route(h)
	require.NoError(t, err)
	assert.Equal(t, "tcp;ofi_rxm", r.Backend, r.Reason)

	// A manager with shm only cannot reach it.
	shmOnly := newManager(t, transport.WithProviders("shm"))
	_, err = shmOnly.Route(h)
	assert.ErrorIs(t, err, transport.ErrNoRoute)
	err = shmOnly.ReadInto(ctxTimeout(t, 5*time.Second), register(t, shmOnly, alloc(t, 4096), 0), h)
	assert.ErrorIs(t, err, transport.ErrNoRoute)
	assert.Contains(t, err.Error(), "tcp;ofi_rxm")

	// Nor can one with mem only, and it says what it has.
	memOnly := newManager(t, transport.WithProviders("mem"))
	_, err = memOnly.Route(h)
	assert.ErrorIs(t, err, transport.ErrNoRoute)
	assert.Contains(t, err.Error(), "offers [tcp;ofi_rxm], this manager has [mem]")
}

func TestConcurrentDisjointSlices(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			const workers, per = 16, 64 << 10
			remote := peer.Register(workers*per, mr.ReadWrite, 5)
			mem := alloc(t, workers*per)
			local := register(t, m, mem, 0)
			want := testpeer.Pattern(workers*per, 5)
			copy(mem, want) // writes put back the bytes reads expect
			ctx := ctxTimeout(t, time.Minute)
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					off := uint64(w * per)
					l, _ := local.Slice(off, per)
					r, _ := remote.Slice(off, per)
					for round := 0; round < 8; round++ {
						var err error
						if (w+round)%2 == 0 {
							err = m.ReadInto(ctx, l, r)
							if err == nil && !bytes.Equal(l.Bytes(), want[off:off+per]) {
								err = fmt.Errorf("worker %d round %d: read data differs", w, round)
							}
						} else {
							err = m.WriteFrom(ctx, r, l)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}(w)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			// Every slice ended with its pattern bytes (reads and writes
			// of the same bytes).
			require.Equal(t, testpeer.Sum(want), peer.Sum(0, 0, workers*per))
		})
	}
}

func TestActionOf100Ops(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			const ops, per = 100, 3000
			src := peer.Register(ops*per, mr.ReadWrite, 9)  // read from it
			sink := peer.Register(ops*per, mr.ReadWrite, 0) // written to
			mem := alloc(t, 2*ops*per)
			local := register(t, m, mem, 0)
			testpeer.Fill(mem[ops*per:], 10)
			a := m.NewAction()
			for i := uint64(0); i < ops; i++ {
				l, _ := local.Slice(i*per, per)
				r, _ := src.Slice(i*per, per)
				if i%2 == 0 {
					a.ReadInto(l, r)
					continue
				}
				w, _ := local.Slice(ops*per+i*per, per)
				s, _ := sink.Slice(i*per, per)
				a.WriteFrom(s, w)
			}
			require.Equal(t, ops, a.Len())
			require.NoError(t, a.Submit(ctxTimeout(t, time.Minute)))
			want := testpeer.Pattern(ops*per, 9)
			for i := 0; i < ops; i += 2 {
				require.Equal(t, want[i*per:(i+1)*per], mem[i*per:(i+1)*per], "op %d", i)
			}
			got := peer.Get(1, 0, ops*per)
			for i := 1; i < ops; i += 2 {
				require.Equal(t, mem[ops*per+i*per:ops*per+(i+1)*per], got[i*per:(i+1)*per], "op %d", i)
			}
		})
	}
}

func TestActionConflicts(t *testing.T) {
	m := newManager(t)
	peer := testpeer.Start(t)
	r := peer.Register(8192, mr.ReadWrite, 1)
	local := register(t, m, alloc(t, 8192), 0)
	a, _ := local.Slice(0, 4096)
	b, _ := local.Slice(2048, 4096)
	ra, _ := r.Slice(0, 4096)
	err := m.NewAction().ReadInto(a, ra).ReadInto(b, ra).Submit(ctxTimeout(t, 5*time.Second))
	assert.ErrorIs(t, err, transport.ErrConflict)
	err = m.NewAction().ReadInto(a, ra).WriteFrom(ra, b).Submit(ctxTimeout(t, 5*time.Second))
	assert.ErrorIs(t, err, transport.ErrConflict)
	// Two writes from the same local bytes do not conflict.
	err = m.NewAction().WriteFrom(ra, a).WriteFrom(ra, b).Submit(ctxTimeout(t, 5*time.Second))
	assert.NoError(t, err)
}

func TestBadInput(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			remote := peer.Register(8192, mr.ReadWrite, 3)
			mem := alloc(t, 8192)
			local := register(t, m, mem, 0)
			ctx := ctxTimeout(t, 20*time.Second)

			_, err := local.Slice(4096, 8192)
			assert.ErrorIs(t, err, transport.ErrOutOfRange)
			_, err = remote.Slice(8193, 0)
			assert.ErrorIs(t, err, transport.ErrOutOfRange)

			small, _ := local.Slice(0, 100)
			err = m.ReadInto(ctx, small, remote)
			assert.ErrorIs(t, err, transport.ErrTooSmall)
			assert.Contains(t, err.Error(), "reading 8192 bytes into a 100-byte buffer")
			rsmall, _ := remote.Slice(0, 10)
			assert.ErrorIs(t, m.WriteFrom(ctx, rsmall, local), transport.ErrTooSmall)

			_, err = m.Register(make([]byte, 4096), mr.ReadWrite)
			assert.ErrorIs(t, err, mr.ErrNotOffHeap)
			assert.Contains(t, err.Error(), "mr.Alloc")

			closed := register(t, m, alloc(t, 4096), 0)
			require.NoError(t, closed.Close())
			require.NoError(t, closed.Close(), "closing twice is a no-op")
			r4k, _ := remote.Slice(0, 4096)
			err = m.ReadInto(ctx, closed, r4k)
			assert.ErrorIs(t, err, transport.ErrBufferClosed)

			// The connection still works after all of that.
			require.NoError(t, m.ReadInto(ctx, local, remote))
			assert.Equal(t, testpeer.Pattern(8192, 3), mem)
		})
	}
}

func TestManagerClose(t *testing.T) {
	m, err := transport.New(context.Background())
	require.NoError(t, err)
	mem := alloc(t, 4096)
	b, err := m.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "closing twice is a no-op")
	_, err = m.Register(mem, mr.ReadWrite)
	assert.ErrorIs(t, err, transport.ErrClosed)
	assert.ErrorIs(t, m.ReadInto(context.Background(), b, b.Remote()), transport.ErrClosed)
	assert.NoError(t, b.Close())
}

// TestWriteIsVisibleAtReturn checks, the instant WriteFrom returns, the
// target's memory itself (process_vm_readv into the child): a nil error
// means the bytes are there.
func TestWriteIsVisibleAtReturn(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			const n = 256 << 10
			remote := peer.Register(n, mr.ReadWrite, 1)
			mem := alloc(t, n)
			local := register(t, m, mem, 0)
			got := make([]byte, n)
			ctx := ctxTimeout(t, time.Minute)
			for i := 0; i < 100; i++ {
				size := uint64(8 << (i % 16)) // 8 B .. 256 KiB
				l, _ := local.Slice(0, size)
				testpeer.Fill(mem[:size], uint64(1000+i))
				require.NoError(t, m.WriteFrom(ctx, remote, l))
				nr, err := unix.ProcessVMReadv(peer.Pid,
					[]unix.Iovec{{Base: &got[0], Len: size}},
					[]unix.RemoteIovec{{Base: uintptr(peer.Addr(0)), Len: int(size)}}, 0)
				require.NoError(t, err)
				require.Equal(t, int(size), nr)
				require.True(t, bytes.Equal(mem[:size], got[:size]), "write %d of %d bytes not visible when WriteFrom returned", i, size)
			}
		})
	}
}

// TestWriteFromShortSource: a source shorter than the remote buffer
// writes its own bytes into the first src.Len() bytes of the remote one
// and nothing after them, alone and in an Action, also when the source is
// the end of its buffer.
func TestWriteFromShortSource(t *testing.T) {
	const n = 4096
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov))
			peer := testpeer.Start(t, prov)
			mem := alloc(t, n)
			local := register(t, m, mem, 0)
			ctx := ctxTimeout(t, time.Minute)
			for i, off := range []uint64{0, n - 8, n - 100} {
				for _, action := range []bool{false, true} {
					seed := uint64(10 + 2*i)
					if action {
						seed++
					}
					remote := peer.Register(n, mr.ReadWrite, seed)
					testpeer.Fill(mem, seed+100)
					src, err := local.Slice(off, n-off)
					require.NoError(t, err)
					if action {
						require.NoError(t, m.NewAction().WriteFrom(remote, src).Submit(ctx))
					} else {
						require.NoError(t, m.WriteFrom(ctx, remote, src))
					}
					want := testpeer.Pattern(n, seed)
					copy(want, mem[off:])
					require.Equal(t, want, peer.Get(int(seed-10), 0, n), "source [%d, %d), action %v", off, n, action)
				}
			}
		})
	}
}

// TestCloseWaitsForOpsInFlight: a transfer that ended by its context can
// leave ops with the provider, which still use the local memory. Close
// must not return nil (the caller then frees the memory) until they are
// done: it waits for them. The owner is stopped, so that the ops cannot
// complete until it continues (tcp: a delivery-complete write needs the
// owner's answer). test/TestCloseWithOpsInFlight has the other end of
// the wait: ops that outlast the manager's timeout, on every route.
func TestCloseWaitsForOpsInFlight(t *testing.T) {
	prov := testenv.RouteTCP
	m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(time.Minute))
	peer := testpeer.Start(t, prov)
	const n = 4 << 20
	remote := peer.Register(n, mr.ReadWrite, 1)
	mem := alloc(t, n)
	local := register(t, m, mem, 0)
	require.NoError(t, m.WriteFrom(ctxTimeout(t, time.Minute), remote, local)) // connected
	peer.Stop()
	defer peer.Continue()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := m.WriteFrom(ctx, remote, local)
	var to *progress.TimeoutError
	require.ErrorAs(t, err, &to, "the write cannot complete with its owner stopped")

	closed := make(chan error, 1)
	go func() { closed <- local.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the stopped owner keeps the write in flight", err)
	case <-time.After(500 * time.Millisecond):
	}
	peer.Continue()
	select {
	case err := <-closed:
		require.NoError(t, err, "the write completed: the buffer is deregistered and its memory free to go")
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting 30 s after the owner continued")
	}
}

func TestTransferErrorLeadsWithTheCause(t *testing.T) {
	cause := &progress.Error{Op: progress.Read, Provider: "efa", Errno: 5}
	e := &transport.TransferError{Op: "read", Bytes: 100, Chunks: 3, Failed: 3, Errs: []error{
		&progress.Error{Op: progress.Read, Provider: "efa", Errno: 125}, cause,
		&progress.Error{Op: progress.Read, Provider: "efa", Errno: 125},
	}}
	assert.Contains(t, e.Error(), "Input/output error")
	assert.Contains(t, e.Error(), "(and 2 more errors)")
	var ce *progress.Error
	require.ErrorAs(t, e, &ce)
	assert.Len(t, e.Unwrap(), 3)
}

func TestActionAllowOverlap(t *testing.T) {
	m := newManager(t, transport.WithProviders("shm"))
	peer := testpeer.Start(t, "shm")
	r := peer.Register(4096, mr.ReadWrite, 3)
	local := register(t, m, alloc(t, 4096), 0)
	a := m.NewAction()
	for i := 0; i < 8; i++ {
		a.ReadInto(local, r)
	}
	assert.ErrorIs(t, a.Submit(ctxTimeout(t, 10*time.Second)), transport.ErrConflict)
	require.NoError(t, a.AllowOverlap().Submit(ctxTimeout(t, 10*time.Second)))
	assert.Equal(t, testpeer.Pattern(4096, 3), local.Bytes(), "every read brought the same bytes")
}

// TestCMABatches: the small ops of one request share process_vm_writev /
// readv calls on the cma path. The bytes must land where each op says,
// across batch boundaries, two remote buffers of one owner, and large ops
// (which go alone) in between.
func TestCMABatches(t *testing.T) {
	testenv.RequireCMA(t)
	m := newManager(t, transport.WithProviders("cma"))
	peer := testpeer.Start(t, "cma")
	const nops = 700 // more than one batch
	sizes := make([]uint64, nops)
	var total uint64
	for i := range sizes {
		sizes[i] = 1 + uint64(i*37)%5000
		if i%250 == 100 {
			sizes[i] = 3 << 20 // over the batching size: alone
		}
		total += sizes[i]
	}
	remotes := []transport.RemoteBuffer{
		peer.Register(int(total), mr.ReadWrite, 0),
		peer.Register(int(total), mr.ReadWrite, 0),
	}
	mem := alloc(t, int(total))
	local := register(t, m, mem, 0)
	testpeer.Fill(mem, 21)
	want := bytes.Clone(mem)

	each := func(f func(l *transport.Buffer, r transport.RemoteBuffer)) {
		off := uint64(0)
		for i, n := range sizes {
			l, err := local.Slice(off, n)
			require.NoError(t, err)
			r, err := remotes[(i/50)%2].Slice(off, n)
			require.NoError(t, err)
			f(l, r)
			off += n
		}
	}
	a := m.NewAction()
	each(func(l *transport.Buffer, r transport.RemoteBuffer) { a.WriteFrom(r, l) })
	require.NoError(t, a.Submit(ctxTimeout(t, time.Minute)))
	got := [][]byte{peer.Get(0, 0, total), peer.Get(1, 0, total)}
	off := uint64(0)
	for i, n := range sizes {
		require.Equal(t, want[off:off+n], got[(i/50)%2][off:off+n], "write %d", i)
		off += n
	}

	clear(mem)
	a = m.NewAction()
	each(func(l *transport.Buffer, r transport.RemoteBuffer) { a.ReadInto(l, r) })
	require.NoError(t, a.Submit(ctxTimeout(t, time.Minute)))
	require.Equal(t, want, mem, "read back")
}

// TestFailedActionLeavesBuffersAsTheyWere: an Action refused before
// anything moved (an op's handle denies it, or its buffer is another
// manager's) leaves every local buffer's count of transfers as it was,
// whichever op failed: each Close then returns nil at once, and the
// buffers serve the next request.
func TestFailedActionLeavesBuffersAsTheyWere(t *testing.T) {
	m, other := newManager(t), newManager(t)
	target := register(t, m, alloc(t, 64), mr.RemoteRead) // its handle grants reading only
	foreign := register(t, other, alloc(t, 64), 0)
	for _, tt := range []struct {
		name string
		bad  func(a *transport.Action, local *transport.Buffer) *transport.Action
	}{
		{"a write the handle denies", func(a *transport.Action, local *transport.Buffer) *transport.Action {
			return a.WriteFrom(target.Remote(), local)
		}},
		{"another manager's buffer", func(a *transport.Action, _ *transport.Buffer) *transport.Action {
			return a.ReadInto(foreign, target.Remote())
		}},
	} {
		for _, at := range []int{0, 1, 2} {
			t.Run(fmt.Sprintf("%s, op %d of 3", tt.name, at), func(t *testing.T) {
				var bufs []*transport.Buffer
				a := m.NewAction()
				for i := 0; i < 3; i++ {
					b, err := m.Register(alloc(t, 64), 0)
					require.NoError(t, err)
					bufs = append(bufs, b)
					if i == at {
						a = tt.bad(a, b)
					} else {
						a = a.ReadInto(b, target.Remote())
					}
				}
				err := a.Submit(ctxTimeout(t, 10*time.Second))
				require.Error(t, err)
				require.NoError(t, m.ReadInto(ctxTimeout(t, 10*time.Second), bufs[0], target.Remote()), "the next request")
				for i, b := range bufs {
					assert.NoError(t, b.Close(), "buffer %d", i)
				}
			})
		}
	}
}

// TestAllocMemoryOutlivesItsRegistration: a Close of an Alloc'd buffer
// that waits for a transfer frees the memory only after it closed the
// buffer's registrations, never when the transfer lets go: until then a
// peer's write could still land in the pages through the buffer's key.
// The endpoint is held, so that Close cannot close them.
func TestAllocMemoryOutlivesItsRegistration(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	m := newManager(t, transport.WithProviders(testenv.RouteTCP))
	b, err := m.Alloc(4096, mr.ReadWrite)
	require.NoError(t, err)
	mem := b.Bytes()
	release, err := transport.HoldBuffer(b)
	require.NoError(t, err)
	held := make(chan struct{})
	transport.HoldEndpoint(m, held)
	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	require.Eventually(t, func() bool { return transport.CloseWaits(b) }, 10*time.Second, time.Millisecond,
		"Close did not begin waiting for the transfer")
	release() // the transfer ends: Close goes on, and waits for the endpoint to close the registration
	assert.Never(t, func() bool { return !mr.Whole(mem) }, 200*time.Millisecond, time.Millisecond,
		"the memory was freed while its registration was open")
	close(held)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute of the endpoint's release")
	}
	assert.False(t, mr.Whole(mem), "Close freed the memory")
}

// TestStuckShmEndpointIsReplaced: when a manager's shm endpoint is stuck
// inside libfabric (a peer died holding its region lock, on libfabric
// 1.x), the manager retires it and opens another: new buffers are served
// over shm, a peer that verified the owner before learns the new address,
// and the handles of buffers registered before fail as stale instead of
// waiting on the stuck endpoint.
func TestStuckShmEndpointIsReplaced(t *testing.T) {
	owner := newManager(t, transport.WithProviders("shm"))
	old := register(t, owner, alloc(t, 4096), mr.ReadWrite)
	testpeer.Fill(old.Bytes(), 1)
	peer := testpeer.Start(t, "shm")
	theirs := peer.Register(4096, mr.ReadWrite, 2)
	require.NoError(t, peer.Transfer("read", 0, old.Remote()))

	require.NoError(t, transport.ReplaceSameNode(owner))
	require.NoError(t, owner.ReadInto(ctxTimeout(t, 10*time.Second), old, theirs),
		"a buffer registered before the replacement works as the local side on the new endpoint")
	assert.Equal(t, peer.Sum(0, 0, 4096), testpeer.Sum(old.Bytes()))
	require.NoError(t, owner.WriteFrom(ctxTimeout(t, 10*time.Second), theirs, old))
	var roles []string
	for _, b := range owner.Backends() {
		roles = append(roles, b.Provider+"/"+b.Role)
	}
	want := []string{"shm/retired", "shm/forced"}
	if fabric.RuntimeVersion().Major() >= 2 {
		want = []string{"shm/retired", "shm/outgoing", "shm/forced"} // the manager's own ops go out on the second
	}
	assert.Equal(t, want, roles)

	fresh := register(t, owner, alloc(t, 4096), mr.ReadWrite)
	require.NoError(t, peer.Transfer("write", 0, fresh.Remote()), "a peer verified before reaches a new buffer")
	assert.Equal(t, testpeer.Sum(old.Bytes()), testpeer.Sum(fresh.Bytes()), "what the peer read from the old buffer")
	require.NoError(t, peer.Transfer("read", 0, fresh.Remote()))
	err := peer.Transfer("read", 0, old.Remote())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "stale or altered handle")
}

// TestOwnerReplacesAnShmEndpointPeersLeftFull: on libfabric 2.x a killed
// peer leaves its slot of the owner's shm map taken, and a full map
// (256 slots) served no peer at all, the live ones included (255 killed
// peers did that, by hand). The owner counts those slots and replaces its
// first shm endpoint once leftBudget are taken and no peer attends it
// ("idle": 3 here), or once they and the peers attending reach leftLimit
// ("crowded": 3 dead and a live peer, against 4); it closes the old
// endpoint, which unmaps what the dead peers left. A new peer is served
// on the new one; a handle of a buffer registered before fails over shm
// as stale, saying the owner replaced the endpoint. 1.x's map does not
// hand out a slot in use: nothing is replaced there, and the dead peers'
// regions stay mapped (docs/RELIABILITY.md, "Left: 1.x").
func TestOwnerReplacesAnShmEndpointPeersLeftFull(t *testing.T) {
	for _, tc := range []struct {
		name          string
		budget, limit int
		live          bool
	}{
		{"idle", 3, 100, false},
		{"crowded", 12, 4, true}, // not before the third death: leftBudget/4
	} {
		t.Run(tc.name, func(t *testing.T) {
			transport.SetLeftSlotLimits(t, tc.budget, tc.limit)
			owner := newManager(t, transport.WithProviders("shm"))
			old := register(t, owner, alloc(t, 4096), mr.ReadWrite)
			testpeer.Fill(old.Bytes(), 1)
			first := transport.FirstShmAddress(owner)
			var live *testpeer.Peer
			if tc.live {
				live = testpeer.Start(t, "shm")
				live.Register(4096, mr.ReadWrite, 2)
				require.NoError(t, live.Transfer("read", 0, old.Remote()))
			}
			var dead []int
			for i := 0; i < 3; i++ {
				peer := testpeer.Start(t, "shm")
				peer.Register(4096, mr.ReadWrite, 2)
				require.NoError(t, peer.Transfer("read", 0, old.Remote()))
				dead = append(dead, peer.Pid)
				peer.Kill()
			}
			mapped := func() int {
				maps, err := os.ReadFile("/proc/self/maps")
				require.NoError(t, err)
				n := 0
				for _, pid := range dead {
					n += strings.Count(string(maps), fmt.Sprintf("/dev/shm/%d:", pid))
				}
				return n
			}
			recycles := fabric.RuntimeVersion().Major() >= 2
			if recycles {
				require.Eventually(t, func() bool { return transport.FirstShmAddress(owner) != first }, 30*time.Second, 10*time.Millisecond,
					"the owner replaces the endpoint its dead peers left 3 slots of")
				require.Eventually(t, func() bool { return mapped() == 0 }, 30*time.Second, 10*time.Millisecond,
					"the old endpoint closed, unmapping what the dead peers left: %d mappings left", mapped())
			}
			fresh := register(t, owner, alloc(t, 4096), mr.ReadWrite)
			testpeer.Fill(fresh.Bytes(), 3)
			peer := testpeer.Start(t, "shm")
			peer.Register(4096, mr.ReadWrite, 2)
			require.NoError(t, peer.Transfer("read", 0, fresh.Remote()), "a new peer is served")
			assert.Equal(t, testpeer.Sum(fresh.Bytes()), peer.Sum(0, 0, 4096))
			if !recycles {
				assert.Equal(t, first, transport.FirstShmAddress(owner), "1.x: nothing replaced")
				assert.Equal(t, len(dead), mapped(), "1.x: each dead peer's region stays mapped")
				return
			}
			err := peer.Transfer("read", 0, old.Remote())
			require.ErrorContains(t, err, "stale or altered handle")
			assert.ErrorContains(t, err, "has replaced since")
			if tc.live {
				err := live.Transfer("read", 0, old.Remote())
				assert.ErrorContains(t, err, "has replaced since", "the live peer's handle names the old endpoint too")
				require.NoError(t, live.Transfer("read", 0, fresh.Remote()), "and it reaches a buffer registered since")
			}
			// The peers that verify again after the replacement leave
			// their old connections unclean, toward the old endpoint:
			// nothing of theirs counts against the new one (a review saw
			// each replacement charge the live peers to the next, and
			// replace it in turn).
			assert.Zero(t, transport.LeftSlots(owner), "slots left on the new endpoint")
			assert.NotEqual(t, first, transport.FirstShmAddress(owner))
		})
	}
}

// TestCloseReportsWedgedEndpoint: Close of a manager whose endpoint is
// stuck inside a libfabric call returns, within about the policy's
// WedgeAfter, an error naming that endpoint that errors.Is matches with
// ErrEndpointWedged; a manager without one closes with nil.
func TestCloseReportsWedgedEndpoint(t *testing.T) {
	for _, prov := range []string{"shm", "tcp"} {
		t.Run(prov, func(t *testing.T) {
			policy := progress.DefaultPollPolicy
			policy.WedgeAfter = 100 * time.Millisecond
			m, err := transport.New(context.Background(), transport.WithProviders(prov), transport.WithPollPolicy(policy))
			require.NoError(t, err)
			release := make(chan struct{})
			defer close(release)
			transport.HoldEndpoint(m, release)
			start := time.Now()
			err = m.Close()
			require.ErrorIs(t, err, transport.ErrEndpointWedged)
			var we *progress.WedgedError
			require.ErrorAs(t, err, &we)
			assert.Contains(t, err.Error(), "closing the "+m.Backends()[0].Provider+" endpoint")
			assert.Less(t, time.Since(start), 5*time.Second)
			assert.NoError(t, m.Close(), "the second Close is a no-op")

			clean, err := transport.New(context.Background(), transport.WithProviders(prov))
			require.NoError(t, err)
			assert.NoError(t, clean.Close())
		})
	}
}

// TestRequestKeepsItsDeadlineOnABusyEndpoint: a request that meets its
// endpoint held by another libfabric call gets its error by its limits,
// not at the wedge (WedgeAfter, a minute here), whether its deadline is
// its context's or the manager's timeout. One that must insert its
// peer's address first (its first op to that peer, or the peer's guard
// check over shm) fails without posting: a timeout naming the busy
// endpoint (Busy). One whose peer is known posts its job, and leaves it
// to the loop (Left), which expires it before posting any of it once the
// call returns. Nothing moves either way, and then the same read works.
func TestRequestKeepsItsDeadlineOnABusyEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name           string
		route          string
		setup          func(m *transport.Manager)
		known          bool // a read before the hold inserted the peer
		managerTimeout bool // the request's deadline is the manager's timeout, its context has none
	}{
		{name: "first op to a tcp peer", route: testenv.RouteTCP},
		{name: "guard check over shm", route: testenv.RouteSHM, setup: transport.GuardOverShm},
		{name: "known tcp peer", route: testenv.RouteTCP, known: true},
		{name: "known tcp peer, manager timeout", route: testenv.RouteTCP, known: true, managerTimeout: true},
		{name: "known shm peer, manager timeout", route: testenv.RouteSHM, setup: transport.GuardOverShm, known: true, managerTimeout: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testenv.RequireRoute(t, tc.route)
			policy := progress.DefaultPollPolicy
			policy.WedgeAfter = time.Minute
			opts := []transport.Option{transport.WithProviders(tc.route), transport.WithPollPolicy(policy)}
			if tc.managerTimeout {
				opts = append(opts, transport.WithTimeout(200*time.Millisecond))
			}
			m := newManager(t, opts...)
			if tc.setup != nil {
				tc.setup(m)
			}
			peer := testpeer.Start(t, tc.route)
			h := peer.Register(4096, mr.ReadWrite, 1)
			b := register(t, m, alloc(t, 4096), 0)
			if tc.known {
				require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), b, h))
				clear(b.Bytes())
			}

			release := make(chan struct{})
			transport.HoldOpsEndpoint(m, release)
			ctx := context.Background()
			if !tc.managerTimeout {
				ctx = ctxTimeout(t, 200*time.Millisecond)
			}
			start := time.Now()
			err := m.ReadInto(ctx, b, h)
			elapsed := time.Since(start)
			close(release)
			require.ErrorIs(t, err, transport.ErrTimeout)
			var te *progress.TimeoutError
			require.ErrorAs(t, err, &te)
			var xe *transport.TransferError
			require.ErrorAs(t, err, &xe)
			assert.Len(t, xe.Errs, 1, "one error for the one op")
			if tc.known {
				assert.True(t, te.Left, "the job is left to the loop: %v", err)
				// Whether the loop posts any of it is the loop's to say.
				assert.Zero(t, xe.NotAttempted, "chunks left to the loop are not claimed as not attempted")
				assert.NotContains(t, err.Error(), "never posted")
			} else {
				assert.True(t, te.Busy, "the timeout names the busy endpoint: %v", err)
				assert.Contains(t, err.Error(), "inside a libfabric call that had not returned")
			}
			assert.Less(t, elapsed, 5*time.Second, "the error came at the wedge, not by the request's limits")

			// A read into another buffer: the loop's rounds since the
			// release have expired the left job.
			other := register(t, m, alloc(t, 4096), 0)
			require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), other, h), "once the call returned")
			assert.Equal(t, testpeer.Sum(make([]byte, 4096)), testpeer.Sum(b.Bytes()), "nothing moved")
			require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), b, h))
			assert.Equal(t, peer.Sum(0, 0, 4096), testpeer.Sum(b.Bytes()))
		})
	}
}

// TestWedgeThatClearsReleasesTheBuffer: a transfer whose endpoint is
// stuck inside libfabric fails with ErrEndpointWedged and leaves its job
// to the loop; once the stuck call returns, the loop ends the job and the
// local buffer is free again: its Close returns nil, not an InUseError
// for a transfer that no longer exists.
func TestWedgeThatClearsReleasesTheBuffer(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	policy := progress.DefaultPollPolicy
	policy.WedgeAfter = 100 * time.Millisecond
	m := newManager(t, transport.WithProviders(testenv.RouteTCP), transport.WithPollPolicy(policy),
		transport.WithTimeout(5*time.Second))
	peer := testpeer.Start(t, testenv.RouteTCP)
	h := peer.Register(4096, mr.ReadWrite, 1)
	b, err := m.Register(alloc(t, 4096), 0)
	require.NoError(t, err)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), b, h), "connects")

	release := make(chan struct{})
	transport.HoldEndpoint(m, release)
	err = m.ReadInto(ctxTimeout(t, time.Minute), b, h)
	require.ErrorIs(t, err, transport.ErrEndpointWedged)
	close(release)
	require.NoError(t, b.Close(), "the wedge cleared and the loop ended the job")
}

// TestManagerAlloc: Alloc is allocation and registration in one step,
// and its Buffer's Close frees the memory too; a peer process reaches
// such a buffer on the mem route.
func TestManagerAlloc(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	m := newManager(t)
	b, err := m.Alloc(4096, mr.ReadWrite)
	require.NoError(t, err)
	testpeer.Fill(b.Bytes(), 7)
	peer := testpeer.Start(t)
	peer.Register(4096, mr.ReadWrite, 1)
	require.NoError(t, peer.Transfer("read", 0, b.Remote()))
	assert.Equal(t, testpeer.Sum(b.Bytes()), peer.Sum(0, 0, 4096), "the peer read the buffer")
	mem := b.Bytes()
	require.True(t, mr.Whole(mem))
	assert.ErrorContains(t, mr.Free(mem), "still registered", "freeing it under its registration: the peer could write into the next allocation there")
	require.NoError(t, b.Close())
	assert.False(t, mr.Whole(mem), "Close freed the memory")
	assert.Error(t, mr.Free(mem), "freed once, by Close")
	assert.Nil(t, b.Bytes(), "no slice of the freed memory")
	assert.Equal(t, uint64(4096), b.Len())

	// Memory the caller registered stays the caller's, and so does the slice.
	own := alloc(t, 4096)
	c := register(t, m, own, mr.ReadWrite)
	require.NoError(t, c.Close())
	assert.Equal(t, own, c.Bytes())
}

// TestRegisteredMemoryIsNotFreed: memory of the caller's that a Buffer
// registers cannot be freed until the Buffer's Close returned nil: until
// then a peer's write could land in whatever the next mr.Alloc put at
// that address (a new user's program saw exactly that, over cma, shm and
// tcp). A registration that failed holds nothing.
func TestRegisteredMemoryIsNotFreed(t *testing.T) {
	m := newManager(t)
	mem, err := mr.Alloc(4096)
	require.NoError(t, err)
	b, err := m.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	assert.ErrorContains(t, mr.Free(mem), "still registered")
	require.NoError(t, b.Close())
	require.NoError(t, mr.Free(mem), "free once Close returned nil")

	mem, err = mr.Alloc(4096)
	require.NoError(t, err)
	_, err = m.Register(mem, mr.Access(0x80))
	require.Error(t, err)
	require.NoError(t, mr.Free(mem), "a registration refused holds nothing")

	// Refused once registered on a backend: it deregisters there first
	// (a review found Register panicking on this path).
	memOnly := newManager(t, transport.WithProviders("mem"))
	mem, err = mr.Alloc(4096)
	require.NoError(t, err)
	_, err = memOnly.Register(mem, mr.RemoteWrite)
	require.ErrorIs(t, err, transport.ErrNoRoute, "mem shares no write-only buffer")
	require.NoError(t, mr.Free(mem), "a registration refused holds nothing")
}

// TestHandleOfAClosedManagerOfThisProcess: a handle of another manager of
// this process that has closed names an owner that is gone, on every
// route (ErrPeerGone), as a closed manager of another process does: on
// the same-node routes it read as access denied (a new user's review).
// A forged handle naming this process and an ID it never had stays
// refused (test.TestNoConfusedDeputy, "owner unknown").
func TestHandleOfAClosedManagerOfThisProcess(t *testing.T) {
	for _, route := range providers {
		t.Run(route, func(t *testing.T) {
			testenv.RequireRoute(t, route)
			owner := newManager(t, transport.WithProviders(route))
			b, err := owner.Alloc(4096, mr.ReadWrite)
			require.NoError(t, err)
			h := b.Remote()
			require.NoError(t, owner.Close())
			user := newManager(t, transport.WithProviders(route))
			local := register(t, user, alloc(t, 4096), mr.ReadWrite)
			err = user.ReadInto(ctxTimeout(t, 30*time.Second), local, h)
			require.ErrorIs(t, err, transport.ErrPeerGone)
			assert.NotErrorIs(t, err, transport.ErrAccessDenied)
		})
	}
}

// TestNoLateBytesAfterNil: a read whose deadline came while its op was in
// flight (its owner stopped) leaves that op with the provider, and the
// op's bytes land whenever the owner answers. A later request into the
// same local buffer waits for it (within its own limits) instead of
// returning nil before those late bytes land over its own: before, a new
// user's reused buffer took in a timed-out read's bytes after the next
// read had returned nil.
func TestNoLateBytesAfterNil(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	const n = 1 << 20
	m := newManager(t, transport.WithProviders(testenv.RouteTCP), transport.WithTimeout(time.Minute))
	stalled := testpeer.Start(t, testenv.RouteTCP)
	hs := stalled.Register(n, mr.ReadWrite, 1)
	other := testpeer.Start(t, testenv.RouteTCP)
	ho := other.Register(n, mr.ReadWrite, 2)
	local := register(t, m, alloc(t, n), mr.ReadWrite)
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, hs)) // connected
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, ho))

	stalled.Stop()
	defer stalled.Continue()
	err := m.ReadInto(ctxTimeout(t, 200*time.Millisecond), local, hs)
	require.ErrorIs(t, err, transport.ErrTimeout)
	require.Equal(t, int32(1), transport.LeftOps(local), "the read's op stays in flight")

	err = m.ReadInto(ctxTimeout(t, 500*time.Millisecond), local, ho)
	require.ErrorIs(t, err, transport.ErrTimeout, "a read into memory another op may still write returned nil")
	assert.Contains(t, err.Error(), "left in flight on the local buffer")

	stalled.Continue()
	require.Eventually(t, func() bool { return transport.LeftOps(local) == 0 }, 30*time.Second, time.Millisecond,
		"the left op never completed")
	require.NoError(t, m.ReadInto(ctxTimeout(t, time.Minute), local, ho))
	assert.Equal(t, testpeer.Pattern(n, 2), local.Bytes())
}
