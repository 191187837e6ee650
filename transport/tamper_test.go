package transport_test

import (
	"encoding/json"
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
	require.NoError(t, json.Unmarshal(b, &h))
	for _, ep := range h["endpoints"].([]any) {
		e := ep.(map[string]any)
		e["key"] = e["key"].(float64) + 12345
	}
	b, err = json.Marshal(h)
	require.NoError(t, err)
	var out transport.RemoteBuffer
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}
