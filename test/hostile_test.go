package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// alter rewrites fields of a handle through its JSON form, with exact
// 64-bit numbers. fn gets the top level and the list of endpoints. An
// error means the altered handle is refused when decoded.
func alter(t *testing.T, h transport.RemoteBuffer, fn func(top map[string]any, eps []map[string]any)) (transport.RemoteBuffer, error) {
	t.Helper()
	b, err := json.Marshal(h)
	require.NoError(t, err)
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&top))
	var eps []map[string]any
	for _, e := range top["endpoints"].([]any) {
		eps = append(eps, e.(map[string]any))
	}
	fn(top, eps)
	b, err = json.Marshal(top)
	require.NoError(t, err)
	var out transport.RemoteBuffer
	return out, json.Unmarshal(b, &out)
}

// num reads a 64-bit field of a handle's JSON form: a decimal string
// (version 2), or a json.Number (version 1, decoded with UseNumber).
func num(v any) uint64 {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = string(x)
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// set writes a field as the JSON form does: a 64-bit one as a decimal
// string, the guard's 32-bit slot as a number.
func set(m map[string]any, k string, v uint64) {
	if k == "slot" {
		m[k] = json.Number(strconv.FormatUint(v, 10))
		return
	}
	m[k] = strconv.FormatUint(v, 10)
}

// TestAlteredHandles: handles whose length, offset, key or address were
// altered are refused or fail with an error, and nothing moves: a read
// brings no byte into the local buffer, and nothing is written outside the
// registered region: the owner's neighbouring buffer, which an altered
// address points into, keeps its bytes.
func TestAlteredHandles(t *testing.T) {
	const n = 64 << 10
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(5*time.Second))
			owner := testpeer.Start(t, prov)
			target := owner.Register(n, mr.ReadWrite, 1)
			owner.Register(n, mr.ReadWrite, 2) // the neighbour
			local, mem := register(t, m, 2*n, mr.ReadWrite)
			first, _ := local.Slice(0, n)
			testpeer.Fill(mem, 3)
			wantTarget, wantNeighbour := owner.Sum(0, 0, n), owner.Sum(1, 0, n)
			gap := owner.Addr(1) - owner.Addr(0) // where the neighbour lies from the target (mod 2^64)
			hasGuard := false
			for _, p := range target.Providers() {
				hasGuard = hasGuard || p == "cma" || p == "shm"
			}

			cases := map[string]func(top map[string]any, eps []map[string]any){
				"length past the buffer": func(top map[string]any, _ []map[string]any) {
					set(top, "length", num(top["length"])+n)
					set(top, "size", num(top["size"])+n)
				},
				"offset into the neighbour": func(top map[string]any, _ []map[string]any) {
					set(top, "offset", gap)
					set(top, "size", gap+n)
				},
				"key": func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						set(e, "key", num(e["key"])^0xdead)
					}
				},
				"address of the neighbour": func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						set(e, "addr", num(e["addr"])+gap)
					}
				},
				"address past the end": func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						set(e, "addr", num(e["addr"])+n/2) // the second half lies outside
					}
				},
				"address before the buffer": func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						set(e, "addr", num(e["addr"])-4096)
					}
				},
			}
			if hasGuard {
				cases["guard slot"] = func(_ map[string]any, eps []map[string]any) {
					for _, e := range eps {
						if g, ok := e["guard"].(map[string]any); ok {
							set(g, "slot", num(g["slot"])+1) // the neighbour's entry
						}
					}
				}
			}
			for name, fn := range cases {
				t.Run(name, func(t *testing.T) {
					// Each case on a working connection: tcp drops it after
					// a refused op and reconnects on the next ones.
					require.Eventually(t, func() bool { return m.ReadInto(context.Background(), first, target) == nil },
						20*time.Second, 50*time.Millisecond)
					bad, err := alter(t, target, fn)
					if err != nil {
						t.Logf("refused when decoded: %v", err)
						assert.ErrorIs(t, err, transport.ErrBadHandle)
						return
					}
					l, _ := local.Slice(0, min(bad.Len(), 2*n))
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					testpeer.Fill(mem, 3) // the good read above brought the target's bytes
					rerr := m.ReadInto(ctx, l, bad)
					t.Logf("read: %v", rerr)
					assert.Error(t, rerr, "read with an altered %s", name)
					assert.Equal(t, testpeer.Sum(testpeer.Pattern(2*n, 3)), testpeer.Sum(mem), "the failed read brought bytes")
					werr := m.WriteFrom(ctx, bad, l)
					t.Logf("write: %v", werr)
					assert.Error(t, werr, "write with an altered %s", name)
					assert.Equal(t, wantNeighbour, owner.Sum(1, 0, n), "the neighbouring buffer was written")
					assert.Equal(t, wantTarget, owner.Sum(0, 0, n), "the target changed")
				})
			}
			// The good handle still works after all of that.
			require.Eventually(t, func() bool { return m.ReadInto(context.Background(), first, target) == nil },
				20*time.Second, 100*time.Millisecond)
		})
	}
}

// TestUnknownVersion: a handle of another format version is refused when
// decoded, with a message naming both versions.
func TestUnknownVersion(t *testing.T) {
	m := newManager(t)
	b, _ := register(t, m, 4096, mr.ReadWrite)
	h, err := b.Remote().MarshalBinary()
	require.NoError(t, err)
	h[4] = 7
	var r transport.RemoteBuffer
	err = r.UnmarshalBinary(h)
	require.True(t, errors.Is(err, transport.ErrBadHandle))
	assert.Contains(t, err.Error(), "format version 7; this fitransfer reads versions 1 and 2")
}
