package ofi

import (
	"bytes"
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pair opens two endpoints of one provider in this process.
type side struct {
	f  *Fabric
	d  *Domain
	ep *Endpoint
	q  *Queue
}

func openSide(t testing.TB, info *Info) *side {
	f, err := OpenFabric(info)
	require.NoError(t, err)
	d, err := f.OpenDomain(info)
	require.NoError(t, err)
	ep, err := d.OpenEndpoint(256, false, EndpointOptions{})
	require.NoError(t, err)
	s := &side{f, d, ep, NewQueue(16, 64)}
	t.Cleanup(func() { ep.Close(); s.q.Free(); d.Close(); f.Close() })
	return s
}

func rmaInfo(t testing.TB, prov string, order MsgOrder) *Info {
	h := &Info{Caps: CapMsg | CapRMA | CapRead | CapWrite | CapRemoteRead | CapRemoteWrite, Mode: ModeContext | ModeContext2}
	h.EP.Type = EPRDM
	h.Domain.MRMode = MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MREndpoint
	h.Domain.AVType = AVTable
	h.Fabric.ProvName = prov
	h.Tx.MsgOrder = order
	infos, err := GetInfo(NegotiatedVersion(), "", "", 0, h)
	require.NoError(t, err)
	return &infos[0]
}

func mmap(t testing.TB, n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(b) })
	return b
}

// run posts one op from a to b's memory and progresses both until it
// completes; it returns the completion error, if any.
func run(t *testing.T, a, b *side, op Op) error {
	a.q.Set(0, &op)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := a.q.Post(a.ep, 1)
		if n == 1 {
			break
		}
		require.True(t, errors.Is(err, ErrAgain), "post: %v", err)
		_, _ = a.q.Reap(a.ep)
		_, _ = b.q.Reap(b.ep)
		require.True(t, time.Now().Before(deadline), "post never accepted")
	}
	for time.Now().Before(deadline) {
		_, _ = b.q.Reap(b.ep)
		slots, err := a.q.Reap(a.ep)
		if errors.Is(err, ErrAvail) {
			e, ok, rerr := a.q.ReadErr(a.ep)
			require.NoError(t, rerr)
			require.True(t, ok)
			require.Equal(t, op.Slot, e.Slot)
			return &CallError{Call: "completion: " + e.ProvMessage, Errno: e.Err}
		}
		require.NoError(t, err)
		if len(slots) == 1 {
			require.Equal(t, op.Slot, slots[0])
			return nil
		}
	}
	t.Fatal("op did not complete")
	return nil
}

func TestDataPath(t *testing.T) {
	for _, tc := range []struct {
		prov  string
		order MsgOrder
	}{{"tcp;ofi_rxm", 0}} {
		t.Run(tc.prov, func(t *testing.T) {
			info := rmaInfo(t, tc.prov, tc.order)
			a, b := openSide(t, info), openSide(t, info)
			peer, err := a.ep.InsertAddr(b.ep.Name())
			require.NoError(t, err)
			if tc.prov != "tcp;ofi_rxm" {
				_, err = b.ep.InsertAddr(a.ep.Name())
				require.NoError(t, err)
			}

			virt := info.Domain.MRMode.Has(MRVirtAddr)
			var bindA, bindB *Endpoint
			if info.Domain.MRMode.Has(MREndpoint) {
				bindA, bindB = a.ep, b.ep
			}
			src, dst := mmap(t, 8192), mmap(t, 8192)
			for i := range src {
				src[i] = byte(i * 7)
			}
			mrB, err := b.d.RegMR(uintptr(unsafe.Pointer(&src[0])), 8192, AccessRemoteRead|AccessRemoteWrite, 7, HMEMSystem, 0, bindB)
			require.NoError(t, err)
			mrA, err := a.d.RegMR(uintptr(unsafe.Pointer(&dst[0])), 8192, AccessRead|AccessWrite, 8, HMEMSystem, 0, bindA)
			require.NoError(t, err)
			defer mrA.Close()
			remote := func(off uint64) uint64 {
				if virt {
					return uint64(uintptr(unsafe.Pointer(&src[0]))) + off
				}
				return off
			}
			op := Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 4096, Desc: mrA.Desc(), Remote: remote(100),
				Key: mrB.Key(), Peer: peer, Flags: uint64(OpCompletion), Slot: 5}
			require.NoError(t, run(t, a, b, op))
			require.True(t, bytes.Equal(src[100:4196], dst[:4096]))

			// A write, delivery complete.
			for i := range dst {
				dst[i] = 0xAB
			}
			op = Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 1000, Desc: mrA.Desc(), Remote: remote(0),
				Key: mrB.Key(), Peer: peer, Flags: uint64(OpCompletion | OpDeliveryComplete), Slot: 6, Write: true}
			require.NoError(t, run(t, a, b, op))
			require.Equal(t, bytes.Repeat([]byte{0xAB}, 1000), src[:1000])

			// A wrong key must fail, never succeed silently: rxm's owner
			// rejects the op and drops the connection.
			op = Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 64, Desc: mrA.Desc(), Remote: remote(0),
				Key: mrB.Key() ^ 0x5a5a, Peer: peer, Flags: uint64(OpCompletion), Slot: 7}
			err = run(t, a, b, op)
			t.Logf("bad key read: %v", err)
			require.ErrorIs(t, err, ErrCanceled)

			// After the owner deregisters, reads fail: the connection the
			// rejection dropped is gone.
			require.NoError(t, mrB.Close())
			op.Key = mrB.Key()
			op.Slot = 8
			err = run(t, a, b, op)
			t.Logf("read after close: %v", err)
			require.ErrorIs(t, err, ErrNotConn)

			// A new registration is readable once rxm has handled the
			// dropped connection (during progress on both sides); until
			// then ops fail with FI_ENOTCONN, and nothing else.
			clear(dst[:64])
			mrB2, err := b.d.RegMR(uintptr(unsafe.Pointer(&src[0])), 8192, AccessRemoteRead|AccessRemoteWrite, 9, HMEMSystem, 0, bindB)
			require.NoError(t, err)
			defer mrB2.Close()
			op = Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 64, Desc: mrA.Desc(), Remote: remote(0),
				Key: mrB2.Key(), Peer: peer, Flags: uint64(OpCompletion), Slot: 9}
			failed := 0
			for deadline := time.Now().Add(10 * time.Second); ; failed++ {
				err = run(t, a, b, op)
				if err == nil {
					break
				}
				require.ErrorIs(t, err, ErrNotConn, "read %d after the errors", failed+1)
				require.True(t, time.Now().Before(deadline), "rxm still not connected 10 s after the errors: %v", err)
			}
			t.Logf("a read succeeded after %d failed with FI_ENOTCONN", failed)
			require.Equal(t, src[:64], dst[:64])
			for i := 0; i < 3; i++ {
				clear(dst[:64])
				require.NoError(t, run(t, a, b, op), "read %d after the reconnection", i)
				require.Equal(t, src[:64], dst[:64])
			}
		})
	}
}
