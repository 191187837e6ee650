package test

import (
	"encoding/binary"
	"testing"

	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// Forging handles, for the attacks of trust_test.go and
// hostile_serve_test.go.

// guardEntry is a guard table entry (transport/guard.go's layout) that
// lets whoever checks it reach size bytes at base.
func guardEntry(gen, shmKey, base, size uint64, access mr.Access, id, cmaKey, table uint64) []byte {
	b := make([]byte, 64)
	for i, w := range []uint64{gen, shmKey, base, size, uint64(access), id, cmaKey, table} {
		binary.LittleEndian.PutUint64(b[8*i:], w)
	}
	return b
}

// endpointOf returns the JSON endpoint of provider in a handle's JSON form.
func endpointOf(eps []map[string]any, provider string) map[string]any {
	for _, e := range eps {
		if e["provider"] == provider {
			return e
		}
	}
	return nil
}

func handleJSON(t *testing.T, h transport.RemoteBuffer) (map[string]any, []map[string]any) {
	t.Helper()
	var top map[string]any
	var eps []map[string]any
	_, _ = alter(t, h, func(tp map[string]any, e []map[string]any) { top, eps = tp, e })
	return top, eps
}
