package transport

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/mr"
)

// sampleHandle is a handle as an shm + tcp manager makes it.
func sampleHandle() RemoteBuffer {
	return RemoteBuffer{
		node: ID{1, 2, 3}, owner: ID{4, 5, 6}, id: 7, off: 100, n: 4000, size: 8192, access: mr.ReadWrite,
		eps: []remoteEP{
			{provider: "shm", name: []byte("fi_shm://1234:0:0\x00"), key: 0xdeadbeef, base: 0x7f0000001000,
				guard: &guardRef{table: 0x7f0000100000, key: 99, slot: 3, gen: 2}},
			{provider: "tcp;ofi_rxm", name: []byte{2, 0, 0x1e, 0x61, 127, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}, key: 0x1234, base: 0},
		},
	}
}

// roundTrip checks that h survives its binary and its JSON form, and
// returns the JSON.
func roundTrip(t *testing.T, h RemoteBuffer) []byte {
	t.Helper()
	b, err := h.MarshalBinary()
	require.NoError(t, err)
	var back RemoteBuffer
	require.NoError(t, back.UnmarshalBinary(b))
	assert.Equal(t, h, back)
	j, err := json.Marshal(h)
	require.NoError(t, err)
	var fromJSON RemoteBuffer
	require.NoError(t, json.Unmarshal(j, &fromJSON))
	assert.Equal(t, h, fromJSON)
	return j
}

func TestHandleRoundTrip(t *testing.T) {
	j := roundTrip(t, sampleHandle())
	assert.Contains(t, string(j), `"provider":"tcp;ofi_rxm"`)
	assert.Contains(t, string(j), `"access":["remote_read","remote_write"]`)
}

func TestHandleRejectsDamage(t *testing.T) {
	h := sampleHandle()
	good, err := h.MarshalBinary()
	require.NoError(t, err)
	for n := 0; n < len(good); n++ {
		var r RemoteBuffer
		err := r.UnmarshalBinary(good[:n])
		require.Error(t, err, "truncated to %d bytes", n)
		assert.True(t, errors.Is(err, ErrBadHandle))
	}
	for i := range good {
		bad := bytes.Clone(good)
		bad[i] ^= 0x40
		var r RemoteBuffer
		assert.ErrorIs(t, r.UnmarshalBinary(bad), ErrBadHandle, "byte %d flipped", i)
	}
	var r RemoteBuffer
	assert.ErrorIs(t, r.UnmarshalBinary(append(bytes.Clone(good), 0)), ErrBadHandle)
	assert.ErrorIs(t, r.UnmarshalBinary(make([]byte, MaxHandleSize+1)), ErrBadHandle)
}

func TestHandleVersion(t *testing.T) {
	good, err := sampleHandle().MarshalBinary()
	require.NoError(t, err)
	assert.Equal(t, byte(2), good[4])
	bad := bytes.Clone(good)
	bad[4] = 3
	var r RemoteBuffer
	err = r.UnmarshalBinary(bad)
	assert.ErrorIs(t, err, ErrBadHandle)
	assert.Contains(t, err.Error(), "format version 3; this fitransfer reads versions 1 and 2")

	err = json.Unmarshal([]byte(`{"version":4}`), &r)
	assert.ErrorIs(t, err, ErrBadHandle)
	assert.ErrorContains(t, err, "JSON format version 4; this fitransfer reads versions 1 to 3")
}

// sampleV1 is sampleHandle as fitransfer 8198468 encoded it: binary
// format version 1, before rails.
const sampleV1 = "4654524201000302010203000000000000000000000000000405060000000000000000000000000007000000000000006400000000000000a00f00000000000000200000000000000373686d120066695f73686d3a2f2f313233343a303a3000efbeadde0000000000100000007f00000100001000007f000063000000000000000300000002000000000000000b7463703b6f66695f72786d100002001e617f000001000000000000000034120000000000000000000000000000003433e13b"

// TestHandleBinaryVersion1: handles of the format before rails still
// decode, every endpoint on rail 0.
func TestHandleBinaryVersion1(t *testing.T) {
	v1, err := hex.DecodeString(sampleV1)
	require.NoError(t, err)
	var r RemoteBuffer
	require.NoError(t, r.UnmarshalBinary(v1))
	assert.Equal(t, sampleHandle(), r)
}

// railHandle is a handle as a manager with four tcp rails makes it.
func railHandle() RemoteBuffer {
	h := sampleHandle()
	tcp := h.eps[1]
	h.eps = h.eps[:1]
	for rail := uint8(0); rail < 4; rail++ {
		ep := tcp
		ep.rail, ep.key = rail, 0x1234+uint64(rail)
		ep.name = []byte{2, 0, 0x1e, 0x61, 10, 80, rail, 2, 0, 0, 0, 0, 0, 0, 0, 0}
		h.eps = append(h.eps, ep)
	}
	return h
}

func TestHandleRails(t *testing.T) {
	h := railHandle()
	j := roundTrip(t, h)
	assert.Equal(t, 4, h.rails("tcp;ofi_rxm"))
	assert.Equal(t, uint64(0x1236), h.railEP("tcp;ofi_rxm", 2).key)
	assert.Nil(t, h.railEP("tcp;ofi_rxm", 4))
	assert.Contains(t, string(j), `"version":3`)
	assert.Contains(t, string(j), `"provider":"tcp;ofi_rxm","rail":3,`)

	// A version 2 JSON handle had no rails: one that claims some was
	// not written by fitransfer.
	v2 := strings.Replace(string(j), `"version":3`, `"version":2`, 1)
	var fromJSON RemoteBuffer
	err := json.Unmarshal([]byte(v2), &fromJSON)
	assert.ErrorIs(t, err, ErrBadHandle)
	assert.ErrorContains(t, err, "a rail in a version 2 handle")
}

// TestHandleJSONThroughGenericDecoder: a handle whose keys and addresses
// lie above 2^53 survives a trip through a generic decoder
// (map[string]any, where JSON numbers become float64) and back: the JSON
// form writes 64-bit fields as decimal strings.
func TestHandleJSONThroughGenericDecoder(t *testing.T) {
	h := sampleHandle()
	h.id = 1<<60 + 3
	h.eps[0].key, h.eps[0].base = 0xfedcba9876543211, 0x7fff_ffff_ffff_f001
	h.eps[0].guard.table, h.eps[0].guard.key, h.eps[0].guard.gen = 1<<62+5, 1<<63+7, 1<<54+1
	j, err := json.Marshal(h)
	require.NoError(t, err)
	assert.Contains(t, string(j), `"key":"18364758544493064721"`)
	var generic map[string]any
	require.NoError(t, json.Unmarshal(j, &generic))
	again, err := json.Marshal(generic)
	require.NoError(t, err)
	var back RemoteBuffer
	require.NoError(t, json.Unmarshal(again, &back))
	assert.Equal(t, h, back)
}

// TestHandleJSONVersion1: handles written before 64-bit fields became
// strings (version 1, JSON numbers) still decode, exactly.
func TestHandleJSONVersion1(t *testing.T) {
	v1 := `{"version":1,"node":"01020300000000000000000000000000","owner":"04050600000000000000000000000000",` +
		`"id":7,"offset":100,"length":4000,"size":8192,"access":["remote_read","remote_write"],` +
		`"endpoints":[{"provider":"shm","name":"ZmlfIHNobTovLzEyMzQ6MDowAA==","key":18364758544493064721,"addr":139637976879104,` +
		`"guard":{"table":139637977927680,"key":99,"slot":3,"gen":2}}]}`
	var r RemoteBuffer
	require.NoError(t, json.Unmarshal([]byte(v1), &r))
	assert.Equal(t, uint64(18364758544493064721), r.eps[0].key)
	assert.Equal(t, uint64(139637976879104), r.eps[0].base)
	assert.Equal(t, uint64(7), r.id)
}

func TestHandleFieldChecks(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*RemoteBuffer)
		want   string
	}{
		{"range past the end", func(r *RemoteBuffer) { r.n = r.size }, "outside the 8192-byte buffer"},
		{"offset overflow", func(r *RemoteBuffer) { r.off = ^uint64(0) - 10 }, "outside"},
		{"no endpoint", func(r *RemoteBuffer) { r.eps = nil }, "no endpoint"},
		{"empty provider", func(r *RemoteBuffer) { r.eps[0].provider = "" }, "provider name of 0 bytes"},
		{"duplicate provider", func(r *RemoteBuffer) { r.eps[1].provider = "shm" }, "listed twice"},
		{"duplicate rail", func(r *RemoteBuffer) { r.eps[1].provider, r.eps[1].rail = "shm", r.eps[0].rail }, `provider "shm" rail 0 listed twice`},
		{"rail out of range", func(r *RemoteBuffer) { r.eps[1].rail = maxRails }, "rail 32, at most 32 rails"},
		{"empty address", func(r *RemoteBuffer) { r.eps[1].name = nil }, "address of 0 bytes"},
		{"address overflow", func(r *RemoteBuffer) { r.eps[0].base = ^uint64(0) - 5 }, "overflows"},
		{"access bits", func(r *RemoteBuffer) { r.access = 0x80 }, "unknown access bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := sampleHandle()
			h.eps = append([]remoteEP(nil), h.eps...)
			tt.modify(&h)
			_, err := h.MarshalBinary()
			assert.ErrorIs(t, err, ErrBadHandle)
			assert.ErrorContains(t, err, tt.want)
		})
	}
}

func TestRemoteSlice(t *testing.T) {
	h := sampleHandle()
	s, err := h.Slice(10, 20)
	require.NoError(t, err)
	assert.Equal(t, uint64(20), s.Len())
	assert.Equal(t, uint64(110), s.off)
	_, err = h.Slice(3990, 11)
	assert.ErrorIs(t, err, ErrOutOfRange)
	_, err = h.Slice(^uint64(0), 2)
	assert.ErrorIs(t, err, ErrOutOfRange)
	// An end past 2^64 is not shown wrapped.
	_, err = h.Slice(1<<63, 1<<63)
	assert.ErrorContains(t, err, "a slice of 9223372036854775808 bytes at offset 9223372036854775808 of a")
}

func FuzzUnmarshalBinary(f *testing.F) {
	good, _ := sampleHandle().MarshalBinary()
	f.Add(good)
	f.Add(good[:len(good)/2])
	rails, _ := railHandle().MarshalBinary()
	f.Add(rails)
	v1, _ := hex.DecodeString(sampleV1)
	f.Add(v1)
	f.Add([]byte("FTRB"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RemoteBuffer
		if err := r.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrBadHandle) {
				t.Fatalf("error not wrapping ErrBadHandle: %v", err)
			}
			return
		}
		// A handle that decodes re-encodes to the same bytes (a version 1
		// handle: to version 2 bytes that decode to it) and its range
		// lies inside its buffer.
		again, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded handle does not re-encode: %v", err)
		}
		if data[4] == 1 {
			var back RemoteBuffer
			if err := back.UnmarshalBinary(again); err != nil || !reflect.DeepEqual(back, r) {
				t.Fatalf("version 1 handle does not survive re-encoding: %v", err)
			}
		} else if !bytes.Equal(again, data) {
			t.Fatalf("decoded handle does not re-encode to its bytes")
		}
		if r.off+r.n > r.size || r.off+r.n < r.off {
			t.Fatalf("range [%d,+%d) outside %d", r.off, r.n, r.size)
		}
	})
}

func FuzzUnmarshalJSON(f *testing.F) {
	good, _ := json.Marshal(sampleHandle())
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"length":18446744073709551615,"size":1,"endpoints":[{"provider":"shm","name":"AA=="}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r RemoteBuffer
		if err := json.Unmarshal(data, &r); err != nil {
			return
		}
		if err := r.check(); err != nil {
			t.Fatalf("decoded an invalid handle: %v", err)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var back RemoteBuffer
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("re-decoding: %v", err)
		}
	})
}
