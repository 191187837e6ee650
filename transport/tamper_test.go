package transport_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/transport"
)

// tamperKey changes the key of every endpoint of a handle (through its
// JSON form, which has no checksum).
func tamperKey(t *testing.T, r transport.RemoteBuffer) transport.RemoteBuffer {
	t.Helper()
	b, err := json.Marshal(r)
	require.NoError(t, err)
	var h map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber() // 64-bit keys do not survive float64
	require.NoError(t, dec.Decode(&h))
	for _, ep := range h["endpoints"].([]any) {
		e := ep.(map[string]any)
		k, err := strconv.ParseUint(string(e["key"].(json.Number)), 10, 64)
		require.NoError(t, err)
		e["key"] = json.Number(strconv.FormatUint(k^0x5a5a5a5a, 10))
	}
	b, err = json.Marshal(h)
	require.NoError(t, err)
	var out transport.RemoteBuffer
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}
