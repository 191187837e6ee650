package ofi

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFlagStrings(t *testing.T) {
	assert.Equal(t, "FI_MSG | FI_RMA | FI_READ", (CapMsg | CapRMA | CapRead).String())
	assert.Equal(t, "0", Caps(0).String())
	assert.Equal(t, "FI_RMA | 0x4000", (CapRMA | 1<<14).String())
	assert.Equal(t, "FI_MR_LOCAL | FI_MR_PROV_KEY", (MRLocal | MRProvKey).String())
	assert.Equal(t, "FI_COMPLETION | FI_DELIVERY_COMPLETE", (OpCompletion | OpDeliveryComplete).String())
	assert.Equal(t, "FI_ORDER_NONE", CompOrder(0).String())
	assert.Equal(t, "FI_EP_RDM", EPRDM.String())
	assert.Equal(t, "Unknown(99)", EPType(99).String())
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		in   string
		want Caps
	}{
		{"FI_MSG|FI_RMA", CapMsg | CapRMA},
		{"fi_rma | read", CapRMA | CapRead},
		{"FI_REMOTE_WRITE", CapRemoteWrite},
		{"", 0},
	}
	for _, tt := range tests {
		got, err := ParseCaps(tt.in)
		require.NoError(t, err, tt.in)
		assert.Equal(t, tt.want, got, tt.in)
	}
	_, err := ParseCaps("FI_MSG|FI_NOPE")
	var bad *BadNameError
	require.True(t, errors.As(err, &bad))
	assert.Equal(t, "FI_NOPE", bad.Name)
	assert.Contains(t, bad.Valid, "FI_RMA")

	e, err := ParseEPType("rdm")
	require.NoError(t, err)
	assert.Equal(t, EPRDM, e)
	_, err = ParseEPType("FI_EP_NOPE")
	assert.ErrorContains(t, err, `unknown endpoint type "FI_EP_NOPE"`)
}

func TestFlagJSON(t *testing.T) {
	b, err := json.Marshal(CapRMA | CapRead | 1<<14)
	require.NoError(t, err)
	assert.JSONEq(t, `["FI_RMA","FI_READ","0x4000"]`, string(b))
	var c Caps
	require.NoError(t, json.Unmarshal(b, &c))
	assert.Equal(t, CapRMA|CapRead|1<<14, c)
	b, _ = json.Marshal(Caps(0))
	assert.Equal(t, "[]", string(b))
	assert.Error(t, json.Unmarshal([]byte(`["FI_BOGUS"]`), &c))
}

func TestErrno(t *testing.T) {
	assert.Equal(t, "No data available (FI_ENODATA 61)", ErrNoData.Error())
	assert.Equal(t, "Resource temporarily unavailable (FI_EAGAIN 11)", ErrAgain.Error())
	assert.Equal(t, "Required key not available (FI_ENOKEY 266)", ErrNoKey.Error())
	assert.Contains(t, Errno(9999).Error(), "(FI_E? 9999)")
	var err error = &CallError{Call: "fi_read", Errno: ErrIO}
	assert.True(t, errors.Is(err, ErrIO))
	var e Errno
	require.True(t, errors.As(err, &e))
	assert.Equal(t, ErrIO, e)
	assert.Equal(t, "fi_read: Input/output error (FI_EIO 5)", err.Error())
}

func TestVersion(t *testing.T) {
	v := MakeVersion(1, 18)
	assert.Equal(t, "1.18", v.String())
	assert.True(t, v.AtLeast(1, 17))
	assert.False(t, v.AtLeast(2, 0))
	var w Version
	require.NoError(t, w.UnmarshalText([]byte("2.1")))
	assert.Equal(t, MakeVersion(2, 1), w)
	assert.Error(t, w.UnmarshalText([]byte("x")))
	assert.LessOrEqual(t, NegotiatedVersion(), CompiledVersion())
	assert.LessOrEqual(t, NegotiatedVersion(), RuntimeVersion())
}

func TestAddrString(t *testing.T) {
	in4 := []byte{2, 0, 0x1e, 0x61, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}
	assert.Equal(t, "fi_sockaddr_in://127.0.0.1:7777", Addr{Format: AddrSockaddrIn, Bytes: in4}.String())
	in6 := make([]byte, 28)
	in6[0], in6[2], in6[3], in6[23] = 10, 0, 80, 1
	assert.Equal(t, "fi_sockaddr_in6://[::1]:80", Addr{Format: AddrSockaddrIn6, Bytes: in6}.String())
	assert.Equal(t, "fi_shm://42", Addr{Format: AddrStr, Bytes: []byte("fi_shm://42\x00\x00")}.String())
	assert.Equal(t, "(null)", Addr{}.String())
	assert.Equal(t, "0x0102", Addr{Format: 99, Bytes: []byte{1, 2}}.String())
}
