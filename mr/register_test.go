package mr_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/endpoint"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
)

// open opens an endpoint of provider, as a manager does.
func open(t *testing.T, provider string) *endpoint.Endpoint {
	t.Helper()
	infos, err := fabric.GetInfo(fabric.Query{Hints: fabric.RMAHints(provider)})
	require.NoError(t, err)
	require.NotEmpty(t, infos)
	ep, err := endpoint.Open(&infos[0])
	require.NoError(t, err)
	t.Cleanup(ep.Close)
	return ep
}

// TestRegisterDrawsKeysAgain: with fitransfer's random keys (no
// FI_MR_PROV_KEY), a key the domain already uses is drawn again, so that
// every registration gets its own. One-byte keys make collisions certain
// among 100 registrations; sixteen draws make a failure vanishingly rare
// while fewer than half the keys are taken.
func TestRegisterDrawsKeysAgain(t *testing.T) {
	ep := open(t, string(fabric.BackendTCP))
	target := ep.Target()
	require.False(t, target.Attr.MRMode.Has(fabric.MRProvKey), "tcp;ofi_rxm takes the application's keys")
	target.Attr.MRKeySize = 1
	mem, err := mr.Alloc(100 * 4096)
	require.NoError(t, err)
	defer mr.Free(mem)
	keys := map[uint64]bool{}
	for i := 0; i < 100; i++ {
		m, err := mr.Register(target, mr.HostRegion(mem[i*4096:(i+1)*4096], mr.ReadWrite))
		require.NoError(t, err, "registration %d", i)
		defer m.Close()
		assert.Less(t, m.Key(), uint64(256))
		assert.False(t, keys[m.Key()], "key %d given twice", m.Key())
		keys[m.Key()] = true
	}
}

// TestRegisterHost registers host memory on each same-node and remote
// provider here; the key is the domain's, the descriptor the provider's.
func TestRegisterHost(t *testing.T) {
	for _, prov := range []string{string(fabric.BackendSHM), string(fabric.BackendTCP)} {
		t.Run(prov, func(t *testing.T) {
			ep := open(t, prov)
			mem, err := mr.Alloc(1 << 20)
			require.NoError(t, err)
			defer mr.Free(mem)
			a, err := mr.Register(ep.Target(), mr.HostRegion(mem[:4096], mr.RemoteRead))
			require.NoError(t, err)
			defer a.Close()
			b, err := mr.Register(ep.Target(), mr.HostRegion(mem[4096:], mr.ReadWrite))
			require.NoError(t, err)
			defer b.Close()
			assert.NotEqual(t, a.Key(), b.Key())
		})
	}
}

// TestRegisterDeviceMemoryHere: device memory on a provider or machine
// without it fails with an error that says so, naming the memory.
func TestRegisterDeviceMemoryHere(t *testing.T) {
	ep := open(t, string(fabric.BackendTCP))
	mem, err := mr.Alloc(4096)
	require.NoError(t, err)
	defer mr.Free(mem)
	r := mr.HostRegion(mem, mr.ReadWrite)
	r.Iface, r.Device = mr.CUDA, 0
	_, err = mr.Register(ep.Target(), r)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "register 4096 bytes of cuda memory (device 0)")
}
