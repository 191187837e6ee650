package ofi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestOptionalFeaturesByHeaders calls every option fitransfer compiles
// only with newer headers, on real endpoints of this machine's providers.
// With headers that declare an option the call reaches the provider, which
// answers (accepts it, or refuses with its own error, never -FI_ENOSYS);
// with older headers (Debian 12's 1.17) fitransfer's stub answers
// -FI_ENOSYS without calling libfabric. `make test` runs this against
// 1.17 and `make test LIBFABRIC=2` against 2.1.
func TestOptionalFeaturesByHeaders(t *testing.T) {
	have := CompiledFeatures()
	t.Logf("headers %s: %s", CompiledVersion(), have)
	for _, prov := range []string{"shm", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			info := rmaInfo(t, prov, 0)
			f, err := OpenFabric(info)
			require.NoError(t, err)
			defer f.Close()
			d, err := f.OpenDomain(info)
			require.NoError(t, err)
			defer d.Close()
			no, yes := false, true
			ep, err := d.OpenEndpoint(64, false, EndpointOptions{SharedMemoryPermitted: &no, CUDAAPIPermitted: &yes})
			require.NoError(t, err, "an option's refusal does not stop the endpoint")
			defer ep.Close()

			check := func(name string, compiled bool, err error) {
				t.Logf("%s: %v", name, err)
				if compiled {
					assert.NotErrorIs(t, err, ErrNoSys, "%s is compiled in: the provider answers", name)
				} else {
					assert.ErrorIs(t, err, ErrNoSys, "%s is not compiled in", name)
				}
			}
			opts := ep.Options()
			check("FI_OPT_SHARED_MEMORY_PERMITTED", have.SharedMemPermit, opts.SharedMemoryPermitted)
			check("FI_OPT_CUDA_API_PERMITTED", have.CUDAAPIPermitted, opts.CUDAAPIPermitted)
			_, err = ep.MaxRMASize()
			check("FI_OPT_MAX_RMA_SIZE", have.MaxRMASize, err)
			// The EFA options need an efa domain (a device): here only
			// the guards answer.
			_, _, err = d.ProbeEFAEmulated()
			check("FI_OPT_EFA_EMULATED_READ/WRITE", have.EFAEmulatedOpts, err)
			if have.EFAEmulatedOpts {
				assert.ErrorIs(t, err, ErrNoProtoOpt, "only efa has the EFA options")
			}
		})
	}
}

// TestOptionsLeftAlone: without options nothing is set and nothing fails.
func TestOptionsLeftAlone(t *testing.T) {
	info := rmaInfo(t, "shm", 0)
	s := openSide(t, info)
	assert.Equal(t, OptionResults{}, s.ep.Options())
}
