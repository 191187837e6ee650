package libfabric

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestWriteFlags: the completion flag of a write, provider by provider,
// from what its manager (transmit) and its action (source free) asked
// for and its size, where it does not depend on shm's single copy. Over
// shm, source free counts on libfabric 2.0 to 2.6 only, without fast
// RMA, for writes shm carries inside its command.
func TestWriteFlags(t *testing.T) {
	tcp := &Route{Provider: fabric.BackendTCP}
	shm := &Route{Provider: fabric.BackendSHM}
	fabric.WithoutShmFastRMA(&shm.Info) // as transport opens shm on 2.x
	fastRMA := &Route{Provider: fabric.BackendSHM}
	efa := &Route{Provider: fabric.BackendEFA}
	const (
		delivery = uint64(fabric.OpDeliveryComplete)
		transmit = uint64(fabric.OpTransmitComplete)
		inject   = uint64(fabric.OpInjectComplete)
	)
	shmSmall := delivery // 1.x: shm's single copy completes once copied; after 2.6: not read
	if shmReadVersion() {
		shmSmall = inject
	}
	for _, tt := range []struct {
		name                 string
		r                    *Route
		transmit, sourceFree bool
		n                    uint64
		flag                 uint64
	}{
		{"tcp", tcp, false, false, 8, delivery},
		{"tcp, transmit", tcp, true, false, 8, transmit},
		{"tcp, source free: no acknowledgement", tcp, false, true, 8, inject},
		{"tcp, transmit and source free", tcp, true, true, 8, inject},
		{"efa, transmit", efa, true, false, 8, transmit},
		{"efa, source free: as without", efa, false, true, 8, delivery},
		{"efa, transmit and source free: as transmit", efa, true, true, 8, transmit},
		{"shm, transmit", shm, true, false, 8, transmit},
		{"shm, source free, inline size", shm, false, true, ShmInlineMax, shmSmall},
		{"shm, source free, above the inline size: as without", shm, false, true, ShmInlineMax + 1, delivery},
		{"shm with fast RMA, source free: as without (the initiator would copy, unchecked)", fastRMA, false, true, 8, delivery},
		{"shm, transmit and source free, above the inline size: as transmit", shm, true, true, 4096, transmit},
		{"tcp, source free, any size", tcp, false, true, 1 << 20, inject},
	} {
		assert.Equal(t, tt.flag, tt.r.WriteFlags(tt.r.Completion(tt.transmit, tt.sourceFree, tt.n), false, false), tt.name)
	}
}

// TestInjectCompleteShmWriteAtClose: an 8 B write over libfabric 2.0 to
// 2.6's shm that may complete once its source is free completes while the
// owner cannot progress (its endpoint held, as Buffer.Close holds it to
// close a registration), and when the owner closes the registration
// before it progresses, the write does not land: its provider looks up
// the key in the same call as it copies. A later delivery-complete write
// from the same initiator, which the owner handles after the first (one
// command queue), lands. On 1.x (and after 2.6) such a write is not
// source free.
func TestInjectCompleteShmWriteAtClose(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	// As a manager opens shm: on 2.x its fast RMA off, the owner copies.
	hints := shmHints
	if !shmReadVersion() {
		require.NotEqual(t, SourceFree, CompletionOver(fabric.BackendSHM, ShmOwnerCopies(hints()), false, true, 8))
		return
	}
	// Freed after the routes close (cleanups run last first): a loop may
	// still look at an op of a failed run.
	omem, err := mr.Alloc(8192)
	require.NoError(t, err)
	t.Cleanup(func() { mr.Free(omem) })
	imem, err := mr.Alloc(4096)
	require.NoError(t, err)
	t.Cleanup(func() { mr.Free(imem) })
	copy(imem, "landed!!")
	copy(imem[64:], "sentinel")
	copy(imem[128:], "connect!")
	owner, initiator := openWith(t, fabric.BackendSHM, hints()), openWith(t, fabric.BackendSHM, hints())
	require.True(t, fabric.ShmFastRMAOff(&initiator.Info), "shm kept the read-after-read order: no fast RMA")
	require.Equal(t, SourceFree, initiator.Completion(false, true, 8))
	closed, err := owner.Register(mr.HostRegion(omem[:4096], mr.ReadWrite))
	require.NoError(t, err)
	closedOpen := true
	defer func() {
		if closedOpen {
			_ = owner.Do(func() { _ = closed.Close() })
		}
	}()
	kept, err := owner.Register(mr.HostRegion(omem[4096:], mr.ReadWrite))
	require.NoError(t, err)
	defer owner.Do(func() { _ = kept.Close() })
	imr, err := initiator.Register(mr.HostRegion(imem, 0))
	require.NoError(t, err)
	defer initiator.Do(func() { _ = imr.Close() })

	write := func(m *fabric.MR, target []byte, local uint64, want Completion) error {
		return write8(initiator, imr, imem[local:], owner, m, target, want)
	}
	// The first op toward an owner connects, which takes the owner's
	// progress.
	require.NoError(t, write(kept, omem[4096:], 128, Delivered), "the first write")
	var injected, closeErr error
	require.NoError(t, owner.Do(func() {
		injected = write(closed, omem[:4096], 0, SourceFree)
		closeErr = closed.Close()
		closedOpen = false
	}))
	require.NoError(t, injected, "the write completes while the owner's endpoint is held")
	require.NoError(t, closeErr)
	require.NoError(t, write(kept, omem[4096:], 64, Delivered), "the delivery-complete write after it")
	assert.Equal(t, "sentinel", string(omem[4096:4104]))
	assert.Equal(t, make([]byte, 8), omem[:8], "the source-free write landed after its registration was closed")
}
