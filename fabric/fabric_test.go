package fabric

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOpenFabricAndDomain(t *testing.T) {
	for _, prov := range []string{"shm", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			infos, err := GetInfo(Query{Hints: RMAHints(prov)})
			require.NoError(t, err)
			require.NotEmpty(t, infos)
			in := &infos[0]
			assert.Equal(t, prov, in.Fabric.ProvName)
			assert.True(t, in.Caps.Has(RMACaps), in.Caps.String())
			assert.Equal(t, EPRDM, in.EP.Type)
			assert.Equal(t, APIVersion(), in.Fabric.APIVersion)

			f, err := OpenFabric(in)
			require.NoError(t, err)
			d, err := f.OpenDomain(in)
			require.NoError(t, err)
			require.NoError(t, d.Close())
			require.NoError(t, d.Close(), "second close is a no-op")
			require.NoError(t, f.Close())
			require.NoError(t, f.Close())
		})
	}
}

func TestGetInfoErrors(t *testing.T) {
	h := RMAHints("shm")
	h.EP.Type = 1 // FI_EP_MSG: shm has none
	_, err := GetInfo(Query{Hints: h})
	require.Error(t, err)
	assert.True(t, errors.Is(err, ErrNoData))
	var gi *GetInfoError
	require.ErrorAs(t, err, &gi)
	assert.Contains(t, err.Error(), "provider shm")
	assert.Contains(t, err.Error(), "endpoint FI_EP_MSG")
	assert.Contains(t, err.Error(), "No data available (FI_ENODATA 61)")

	_, err = GetInfo(Query{Version: MakeVersion(APIVersion().Major()+1, 0)})
	assert.True(t, errors.Is(err, ErrNoSys), "%v", err)
}

func TestCurrentVersions(t *testing.T) {
	v := CurrentVersions()
	assert.NotEmpty(t, v.Library)
	assert.Equal(t, APIVersion(), v.API)
	assert.True(t, v.API <= v.Compiled && v.API <= v.Runtime)
}
