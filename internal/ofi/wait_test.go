package ofi

import (
	"errors"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openSideWith is openSide with a CQ wait fd when wait, and options.
func openSideWith(t *testing.T, info *Info, wait bool, opts EndpointOptions) *side {
	f, err := OpenFabric(info)
	require.NoError(t, err)
	d, err := f.OpenDomain(info)
	require.NoError(t, err)
	ep, err := d.OpenEndpoint(256, wait, opts)
	require.NoError(t, err)
	s := &side{f, d, ep, NewQueue(16, 64)}
	t.Cleanup(func() { ep.Close(); s.q.Free(); d.Close(); f.Close() })
	return s
}

// TestTargetSignals: what tells a target's progress loop that peers keep
// it busy though nothing completes on it. tcp: a peer's read wakes the
// target's wait on its CQ's fd (woke, long before the wait's 10 s), and a
// Signal sent before a wait still ends it. shm: a peer's delivery-complete
// write moves the target's remote counter.
func TestTargetSignals(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		info := rmaInfo(t, "tcp;ofi_rxm", 0)
		a, b := openSide(t, info), openSideWith(t, info, true, EndpointOptions{})
		require.True(t, b.ep.Waitable(), "tcp;ofi_rxm's CQ takes an FI_WAIT_FD wait object")

		b.ep.Signal()
		_, woke, err := b.q.Wait(b.ep, 10_000)
		require.NoError(t, err)
		require.True(t, woke, "a Signal sent before the wait ended it")

		peer, err := a.ep.InsertAddr(b.ep.Name())
		require.NoError(t, err)
		var bindA, bindB *Endpoint
		if info.Domain.MRMode.Has(MREndpoint) {
			bindA, bindB = a.ep, b.ep
		}
		src, dst := mmap(t, 4096), mmap(t, 4096)
		mrB, err := b.d.RegMR(uintptr(unsafe.Pointer(&src[0])), 4096, AccessRemoteRead, 7, HMEMSystem, 0, bindB)
		require.NoError(t, err)
		defer mrB.Close()
		mrA, err := a.d.RegMR(uintptr(unsafe.Pointer(&dst[0])), 4096, AccessRead, 8, HMEMSystem, 0, bindA)
		require.NoError(t, err)
		defer mrA.Close()
		remote := uint64(uintptr(unsafe.Pointer(&src[0])))
		if !info.Domain.MRMode.Has(MRVirtAddr) {
			remote = 0
		}
		woken := make(chan bool, 1)
		go func() {
			_, woke, _ := b.q.Wait(b.ep, 10_000)
			woken <- woke
		}()
		op := Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 64, Desc: mrA.Desc(), Remote: remote,
			Key: mrB.Key(), Peer: peer, Flags: uint64(OpCompletion), Slot: 1}
		a.q.Set(0, &op)
		posted := false
		for deadline := time.Now().Add(15 * time.Second); ; {
			if !posted {
				n, err := a.q.Post(a.ep, 1)
				require.True(t, err == nil || errors.Is(err, ErrAgain), "post: %v", err)
				posted = n == 1
			}
			_, _ = a.q.Reap(a.ep)
			select {
			case woke := <-woken:
				// The read's connection request, or the read: either is
				// the peer's traffic.
				assert.True(t, woke, "the peer's read woke the target's wait")
				return
			default:
			}
			require.True(t, time.Now().Before(deadline), "the target's wait never returned")
		}
	})
	t.Run("shm", func(t *testing.T) {
		info := rmaInfo(t, "shm", 0)
		a, b := openSide(t, info), openSideWith(t, info, false, EndpointOptions{RemoteCounter: true})
		require.True(t, b.ep.HasRemoteOps(), "shm takes a counter of peers' RMA ops")
		require.False(t, a.ep.HasRemoteOps(), "not asked for")
		peer, err := a.ep.InsertAddr(b.ep.Name())
		require.NoError(t, err)
		_, err = b.ep.InsertAddr(a.ep.Name())
		require.NoError(t, err)
		src, dst := mmap(t, 4096), mmap(t, 4096)
		mrB, err := b.d.RegMR(uintptr(unsafe.Pointer(&src[0])), 4096, AccessRemoteRead|AccessRemoteWrite, 7, HMEMSystem, 0, nil)
		require.NoError(t, err)
		defer mrB.Close()
		mrA, err := a.d.RegMR(uintptr(unsafe.Pointer(&dst[0])), 4096, AccessRead|AccessWrite, 8, HMEMSystem, 0, nil)
		require.NoError(t, err)
		defer mrA.Close()
		remote := uint64(uintptr(unsafe.Pointer(&src[0])))
		if !info.Domain.MRMode.Has(MRVirtAddr) {
			remote = 0
		}
		require.Zero(t, b.ep.RemoteOps())
		op := Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 64, Desc: mrA.Desc(), Remote: remote,
			Key: mrB.Key(), Peer: peer, Flags: uint64(OpCompletion | OpDeliveryComplete), Slot: 1, Write: true}
		require.NoError(t, run(t, a, b, op))
		assert.Equal(t, uint64(1), b.ep.RemoteOps(), "the write the target's progress applied")
	})
}
