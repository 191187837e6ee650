package ofi

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGetInfoAllProviders(t *testing.T) {
	infos, err := GetInfo(NegotiatedVersion(), "", "", 0, nil)
	require.NoError(t, err)
	require.NotEmpty(t, infos)
	for _, i := range infos {
		assert.NotEmpty(t, i.Provider())
		assert.Contains(t, i.Verbose(), "prov_name: "+i.Provider()+"\n")
	}
}

func TestGoBuiltInfoRendersLikeProviderInfo(t *testing.T) {
	// An Info converted to Go and back to C must render, through
	// libfabric's own fi_tostr, exactly as the provider's fi_info did
	// (neither tcp nor shm has a nic on this machine).
	infos, err := GetInfo(NegotiatedVersion(), "", "", 0, &Info{Fabric: FabricAttr{ProvName: "tcp"}})
	require.NoError(t, err)
	for _, i := range infos {
		if i.NIC != nil {
			continue
		}
		copied := i
		copied.tostr = ""
		assert.Equal(t, i.Verbose(), copied.Verbose())
	}
}

func TestInfoJSONRoundTrip(t *testing.T) {
	infos, err := GetInfo(NegotiatedVersion(), "", "", 0, nil)
	require.NoError(t, err)
	for _, i := range infos {
		b, err := json.Marshal(i)
		require.NoError(t, err)
		var back Info
		require.NoError(t, json.Unmarshal(b, &back))
		back.tostr = i.tostr
		assert.Equal(t, i, back)
	}
}

func TestGetInfoUnknownProviderIsNoData(t *testing.T) {
	_, err := GetInfo(NegotiatedVersion(), "", "", 0, &Info{Fabric: FabricAttr{ProvName: "nosuchprov"}})
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrNoData)
	assert.Contains(t, err.Error(), "fi_getinfo: No data available")
}

func TestGetInfoTooNewVersionIsNoSys(t *testing.T) {
	_, err := GetInfo(MakeVersion(RuntimeVersion().Major()+1, 0), "", "", 0, nil)
	assert.ErrorIs(t, err, ErrNoSys)
}
