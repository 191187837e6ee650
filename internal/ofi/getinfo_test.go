package ofi

import (
	"encoding/json"
	"strings"
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
	// libfabric's own fi_tostr, exactly as the provider's fi_info did —
	// but for the nic, which a Go-built Info does not carry: there the
	// provider's nic section (the last of an fi_info) becomes "(nil)".
	infos, err := GetInfo(NegotiatedVersion(), "", "", 0, &Info{Fabric: FabricAttr{ProvName: "tcp"}})
	require.NoError(t, err)
	require.NotEmpty(t, infos)
	for _, i := range infos {
		want := i.Verbose()
		if i.NIC != nil {
			at := strings.LastIndex(want, "\n    nic: ")
			require.Positive(t, at, "the nic section of %s", want)
			want = want[:at] + "\n    nic: (nil)\n"
		}
		copied := i
		copied.tostr = ""
		assert.Equal(t, want, copied.Verbose())
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
