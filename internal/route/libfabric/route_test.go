package libfabric

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

func TestMain(m *testing.M) {
	testenv.LoopbackOnly()
	m.Run()
}

// open opens a route of provider, as a manager does.
func open(t *testing.T, provider fabric.Backend) *Route {
	t.Helper()
	return openWith(t, provider, fabric.RMAHints(string(provider)))
}

// shmHints are shm's hints as a manager asks for them: on libfabric 2.x
// with read-after-read order, which turns shm's fast RMA off.
func shmHints() *fabric.Info {
	h := fabric.RMAHints(string(fabric.BackendSHM))
	if fabric.RuntimeVersion().Major() >= 2 {
		fabric.WithoutShmFastRMA(h)
	}
	return h
}

// write8 writes 8 bytes at local (registered as lmr on from) to target
// (registered as tmr on to), asking for want, and returns the op's
// error.
func write8(from *Route, lmr *fabric.MR, local []byte, to *Route, tmr *fabric.MR, target []byte, want Completion) error {
	p, err := from.Peer(to.EndpointName())
	if err != nil {
		return err
	}
	x := from.NewXfer(new(holder))
	defer x.Release()
	x.Aim(p, progress.Write, time.Now(), time.Now().Add(10*time.Second), 0) // x holds p until its job is idle
	x.Job().Flags = from.WriteFlags(want, false, false)
	x.Job().Chunks = append(x.Job().Chunks, progress.Chunk{Local: mr.Addr(local), Desc: lmr.Desc(), Len: 8,
		Remote: mr.RemoteAddr(to.VirtAddr, mr.Addr(target), 0), Key: tmr.Key()})
	if err := x.Submit(); err != nil {
		return err
	}
	if err := from.Wait(context.Background(), x); err != nil {
		return err
	}
	return errors.Join(x.Job().Errs...)
}

// openWith opens a route of provider with hints.
func openWith(t *testing.T, provider fabric.Backend, hints *fabric.Info) *Route {
	t.Helper()
	infos, err := fabric.GetInfo(fabric.Query{Hints: hints})
	require.NoError(t, err)
	require.NotEmpty(t, infos)
	r, err := Open(0, &infos[0], "test", "forced", progress.DefaultPollPolicy, zerolog.Nop(), 0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, r.Close()) })
	require.Equal(t, provider, r.Provider)
	return r
}

// holder counts what Xfers do with the buffer they hold.
type holder struct{ unrefs, stuck, left atomic.Int32 }

func (h *holder) Unref()             { h.unrefs.Add(1) }
func (h *holder) AddStuck(delta int) { h.stuck.Add(int32(delta)) }
func (h *holder) AddLeft(delta int)  { h.left.Add(int32(delta)) }

// TestXferMovesBytes reads and writes between two routes of this process
// through the route's own API — Peer, NewXfer, Aim, Submit, Wait — on
// shm and tcp, and checks the bytes and the buffer's reference.
func TestXferMovesBytes(t *testing.T) {
	for _, prov := range []fabric.Backend{fabric.BackendSHM, fabric.BackendTCP} {
		t.Run(string(prov), func(t *testing.T) {
			owner, initiator := open(t, prov), open(t, prov)
			omem, err := mr.Alloc(1 << 20)
			require.NoError(t, err)
			defer mr.Free(omem)
			imem, err := mr.Alloc(1 << 20)
			require.NoError(t, err)
			defer mr.Free(imem)
			for i := range omem {
				omem[i] = byte(i * 13)
			}
			omr, err := owner.Register(mr.HostRegion(omem, mr.ReadWrite))
			require.NoError(t, err)
			defer owner.Do(func() { _ = omr.Close() })
			imr, err := initiator.Register(mr.HostRegion(imem, 0))
			require.NoError(t, err)
			defer initiator.Do(func() { _ = imr.Close() })
			remote := mr.RemoteAddr(owner.VirtAddr, mr.Addr(omem), 0)

			for _, op := range []progress.Op{progress.Read, progress.Write} {
				if op == progress.Write {
					clear(omem)
				}
				p, err := initiator.Peer(owner.EndpointName())
				require.NoError(t, err)
				h := new(holder)
				x := initiator.NewXfer(h)
				x.Aim(p, op, time.Now(), time.Now().Add(10*time.Second), 0)
				x.Job().Flags = initiator.WriteFlags(Delivered, false, false)
				for off := uint64(0); off < 1<<20; off += 256 << 10 {
					x.Job().Chunks = append(x.Job().Chunks, progress.Chunk{Local: mr.Addr(imem[off:]), Desc: imr.Desc(),
						Len: 256 << 10, Remote: remote + off, Key: omr.Key(), Offset: off})
				}
				require.NoError(t, x.Submit())
				require.NoError(t, initiator.Wait(context.Background(), x))
				assert.Empty(t, x.Job().Errs)
				assert.Equal(t, 4, x.Job().Completed)
				x.Release()
				require.Eventually(t, func() bool { return h.unrefs.Load() == 1 }, 5*time.Second, time.Millisecond,
					"the buffer's reference comes back once, when the loop and the waiter let go")
				assert.Equal(t, omem, imem, "%s", op)
			}
		})
	}
}

// TestPeers: a peer is inserted once and counted per use; Forget leaves
// a peer an Xfer still uses until its last use ends; AddPeer's count
// (Add, Unadd) forgets it with its last undo only.
func TestPeers(t *testing.T) {
	a, b := open(t, fabric.BackendTCP), open(t, fabric.BackendTCP)
	p1, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	p2, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	assert.Same(t, p1, p2)
	assert.Equal(t, int32(2), p1.uses.Load())
	assert.Equal(t, b.Address(), p1.Name())

	known := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.peers[string(b.EndpointName())] != nil
	}
	a.Forget(b.EndpointName())
	p3, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	assert.Same(t, p1, p3, "in use: not forgotten")
	p1.Done()
	p2.Done()
	assert.True(t, known(), "one use left: not forgotten")
	p3.Done()
	require.Eventually(t, func() bool { return !known() }, 5*time.Second, time.Millisecond,
		"the last use of a peer Forget found in use forgets it")
	p1, err = a.Peer(b.EndpointName())
	require.NoError(t, err)
	assert.NotSame(t, p3, p1, "inserted anew")
	p1.Done()
	assert.True(t, known(), "a peer nobody forgot stays after its last use")

	a.Add(b.EndpointName())
	a.Add(b.EndpointName())
	a.Unadd(b.EndpointName())
	p4, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	p4.Done()
	assert.Same(t, p1, p4, "one AddPeer left: kept")
	a.Unadd(b.EndpointName())
	p5, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	p5.Done()
	assert.NotSame(t, p1, p5, "the last undo forgot it: inserted anew")
	a.Unadd([]byte("never added")) // another session's: left alone

	// A session ends (Unadd) while an op still uses the peer, and the
	// next session of the same peer adds it before that op ends: the op's
	// end leaves it to the new session, and so does a Forget meanwhile;
	// the new session's end forgets it.
	p6, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	a.Add(b.EndpointName())
	a.Unadd(b.EndpointName())
	assert.True(t, p6.forget.Load(), "in use: forgotten at its last use")
	a.Add(b.EndpointName())
	assert.False(t, p6.forget.Load(), "added again: no longer forgotten at its last use")
	p6.Done()
	a.Forget(b.EndpointName())
	assert.True(t, known(), "a session holds it: Forget leaves it")
	p7, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	p7.Done()
	assert.Same(t, p6, p7)
	a.Unadd(b.EndpointName())
	assert.False(t, known(), "the second session's end forgot it")

	// A last use's removal is of its own peer only, not of a later one
	// of the same name.
	p8, err := a.Peer(b.EndpointName())
	require.NoError(t, err)
	p8.Done()
	a.forget(b.EndpointName(), p6)
	assert.True(t, known(), "a later peer of the name stays")
}

// TestCheckName: names a provider would misread are refused before
// libfabric sees them.
func TestCheckName(t *testing.T) {
	tcp := open(t, fabric.BackendTCP)
	assert.NoError(t, tcp.CheckName(tcp.EndpointName()))
	for _, bad := range [][]byte{nil, make([]byte, 3), make([]byte, 17), make([]byte, MaxNameLen+1)} {
		assert.ErrorIs(t, tcp.CheckName(bad), errclass.ErrBadHandle, "%d bytes", len(bad))
	}
	// 16 bytes that are no AF_INET address of an endpoint.
	own := tcp.EndpointName()
	require.Len(t, own, 16)
	for _, tc := range []struct {
		name   string
		change func(b []byte)
		want   string
	}{
		{"AF_UNIX", func(b []byte) { binary.LittleEndian.PutUint16(b, syscall.AF_UNIX) }, "address family 1"},
		{"AF_INET6 in 16 bytes", func(b []byte) { binary.LittleEndian.PutUint16(b, syscall.AF_INET6) }, "address family 10"},
		{"family 0xffff", func(b []byte) { binary.LittleEndian.PutUint16(b, 0xffff) }, "address family 65535"},
		{"port 0", func(b []byte) { binary.BigEndian.PutUint16(b[2:], 0) }, "port 0"},
		{"0.0.0.0", func(b []byte) { copy(b[4:8], []byte{0, 0, 0, 0}) }, "IP 0.0.0.0"},
		{"broadcast", func(b []byte) { copy(b[4:8], []byte{255, 255, 255, 255}) }, "IP 255.255.255.255"},
		{"multicast", func(b []byte) { copy(b[4:8], []byte{224, 0, 0, 1}) }, "IP 224.0.0.1"},
	} {
		bad := bytes.Clone(own)
		tc.change(bad)
		err := tcp.CheckName(bad)
		assert.ErrorIs(t, err, errclass.ErrBadHandle, tc.name)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
	shm := open(t, fabric.BackendSHM)
	assert.NoError(t, shm.CheckName(make([]byte, 40)), "shm names come from a verified owner, any length")
	assert.ErrorIs(t, shm.CheckName(make([]byte, MaxNameLen+1)), errclass.ErrBadHandle)
}

// TestOtherFamily: a well-formed address of the other IP family is no
// fault of the name, and no peer either; a malformed one is CheckName's
// to refuse, and not of the other family.
func TestOtherFamily(t *testing.T) {
	v4 := func(port uint16, ip ...byte) []byte {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint16(b, syscall.AF_INET)
		binary.BigEndian.PutUint16(b[2:], port)
		copy(b[4:], ip)
		return b
	}
	v6 := func(port uint16, ip ...byte) []byte {
		b := make([]byte, 28)
		binary.LittleEndian.PutUint16(b, syscall.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], port)
		copy(b[8:], ip)
		return b
	}
	loop6 := append(make([]byte, 15), 1)
	in4 := &Route{Info: fabric.Info{AddrFormat: fabric.AddrSockaddrIn}}
	in6 := &Route{Info: fabric.Info{AddrFormat: fabric.AddrSockaddrIn6}}
	shm := &Route{Provider: fabric.BackendSHM} // FI_ADDR_STR: its format is none of the IP ones
	for _, tc := range []struct {
		name string
		r    *Route
		addr []byte
		want bool
	}{
		{"IPv6 to an IPv4 endpoint", in4, v6(5000, loop6...), true},
		{"IPv4 to an IPv6 endpoint", in6, v4(5000, 127, 0, 0, 1), true},
		{"IPv4 to an IPv4 endpoint", in4, v4(5000, 127, 0, 0, 1), false},
		{"IPv6 to an IPv6 endpoint", in6, v6(5000, loop6...), false},
		{"IPv6 with port 0", in4, v6(0, loop6...), false},
		{"IPv6 unspecified", in4, v6(5000), false},
		{"IPv6 family in 16 bytes", in4, v6(5000, loop6...)[:16], false},
		{"IPv4 family in 28 bytes", in6, append(v4(5000, 127, 0, 0, 1), make([]byte, 12)...), false},
		{"an shm name", shm, []byte("fi_shm://1:0:0"), false},
	} {
		assert.Equal(t, tc.want, tc.r.OtherFamily(tc.addr), tc.name)
	}
	assert.Equal(t, "IPv4", in4.Family())
	assert.Equal(t, "IPv6", in6.Family())
	assert.Empty(t, shm.Family())
}

// TestBlocked: ops left in flight to a dead shm peer block the endpoint
// after blockedGrace, and BlockedOrGone names the dead peer itself when
// the op goes to it.
func TestBlocked(t *testing.T) {
	r := open(t, fabric.BackendSHM)
	assert.NoError(t, r.Blocked())
	r.abandonDead("fi_shm://1:0:0")
	assert.NoError(t, r.Blocked(), "within the grace")
	r.deadSince.Store(time.Now().Add(-time.Second).UnixNano())
	r.deadRound.Store(r.loop.Rounds())
	assert.NoError(t, r.Blocked(), "past the grace, but the loop has not had its rounds: a loaded machine's late completions are not taken for none")
	require.Eventually(t, func() bool { return errors.Is(r.Blocked(), errclass.ErrBlocked) }, 10*time.Second, time.Millisecond,
		"blocked once the loop has had its rounds too")
	assert.NotErrorIs(t, r.Blocked(), errclass.ErrRouteReplaced, "the manager's first shm endpoint stays its")
	assert.Contains(t, r.Blocked().Error(), "close the manager and open a new one")
	r.Outgoing = true
	assert.ErrorIs(t, r.Blocked(), errclass.ErrBlocked)
	assert.ErrorIs(t, r.Blocked(), errclass.ErrRouteReplaced, "an Outgoing endpoint with ops to a dead peer is left for a new one (transport's holdShm)")
	r.Outgoing = false
	gone := append([]byte("fi_shm://999999999:0:0"), 0)
	err := r.BlockedOrGone(progress.Read, gone)
	assert.ErrorIs(t, err, errclass.ErrPeerGone)
	r.deadOps.Add(-1)
	assert.NoError(t, r.Blocked(), "the ops completed after all")
}
