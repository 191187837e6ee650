package test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestAccessRights: a buffer registered without remote write cannot be
// written by a peer — neither with its genuine handle (refused before
// posting, from the handle's access bits) nor with a handle whose access
// bits were altered (refused by whoever checks on that path: fitransfer's
// guard for cma and shm, the provider for tcp;ofi_rxm) — and its bytes do
// not change. Likewise for reads of a buffer without remote read.
func TestAccessRights(t *testing.T) {
	const n = 64 << 10
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(5*time.Second))
			owner := testpeer.Start(t, prov)
			readOnly := owner.Register(n, mr.RemoteRead, 1)
			var writeOnly transport.RemoteBuffer
			if prov == testenv.RouteMem {
				// A mapping reads what it writes: a mem-only owner
				// cannot share a write-only buffer, and says so.
				_, err := owner.TryRegister(n, mr.RemoteWrite, 2)
				require.ErrorContains(t, err, "the mem route shares only memory peers may read")
			} else {
				writeOnly = owner.Register(n, mr.RemoteWrite, 2)
			}
			local, mem := register(t, m, n, mr.ReadWrite)
			testpeer.Fill(mem, 3)
			ctx := context.Background()
			wantRO := owner.Sum(0, 0, n)

			err := m.WriteFrom(ctx, readOnly, local)
			assert.ErrorIs(t, err, transport.ErrAccessDenied, "genuine handle, write")
			if !writeOnly.IsZero() {
				err = m.ReadInto(ctx, local, writeOnly)
				assert.ErrorIs(t, err, transport.ErrAccessDenied, "genuine handle, read")
			}

			forged := func(h transport.RemoteBuffer) transport.RemoteBuffer {
				out, err := alter(t, h, func(top map[string]any, _ []map[string]any) {
					top["access"] = []string{"remote_read", "remote_write"}
				})
				require.NoError(t, err)
				return out
			}
			err = m.WriteFrom(ctx, forged(readOnly), local)
			require.Error(t, err, "a write through forged access bits must fail")
			t.Logf("forged write: %v", err)
			assert.Equal(t, wantRO, owner.Sum(0, 0, n), "the read-only buffer changed")

			require.Eventually(t, func() bool { return m.ReadInto(ctx, local, readOnly) == nil }, 20*time.Second, 50*time.Millisecond)
			if writeOnly.IsZero() {
				return
			}
			testpeer.Fill(mem, 3)
			err = m.ReadInto(ctx, local, forged(writeOnly))
			require.Error(t, err, "a read through forged access bits must fail")
			t.Logf("forged read: %v", err)
			assert.Equal(t, testpeer.Sum(testpeer.Pattern(n, 3)), testpeer.Sum(mem), "nothing arrived")
		})
	}
}

// TestClosedBufferIsUnreachable: after the owner closes a buffer, peers'
// reads and writes fail and its memory does not change; the owner's other
// buffers stay reachable.
func TestClosedBufferIsUnreachable(t *testing.T) {
	const n = 64 << 10
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(5*time.Second))
			owner := testpeer.Start(t, prov)
			h := owner.Register(n, mr.ReadWrite, 1)
			other := owner.Register(n, mr.ReadWrite, 2)
			local, mem := register(t, m, n, mr.ReadWrite)
			require.NoError(t, m.ReadInto(context.Background(), local, h))
			owner.CloseBuf(0)
			want := owner.Sum(0, 0, n)
			testpeer.Fill(mem, 9)
			err := m.WriteFrom(context.Background(), h, local)
			require.Error(t, err)
			t.Logf("write: %v", err)
			assert.Equal(t, want, owner.Sum(0, 0, n), "a closed buffer was written")
			require.Eventually(t, func() bool {
				err = m.ReadInto(context.Background(), local, h)
				return err != nil && !isConnectionError(err)
			}, 20*time.Second, 50*time.Millisecond)
			t.Logf("read: %v", err)
			assert.Equal(t, testpeer.Sum(testpeer.Pattern(n, 9)), testpeer.Sum(mem), "a closed buffer was read")

			require.Eventually(t, func() bool { return m.ReadInto(context.Background(), local, other) == nil },
				20*time.Second, 50*time.Millisecond, "the owner's other buffer stays reachable")
			assert.Equal(t, testpeer.Pattern(n, 2), mem)
		})
	}
}

// isConnectionError: tcp;ofi_rxm drops the connection after a refused op;
// the next op may report that rather than the refusal.
func isConnectionError(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "not connected") || strings.Contains(err.Error(), "connection to the peer is gone"))
}

// TestKeysAreRandom: 10,000 registrations in one domain give no repeated
// and no sequential keys where fitransfer chooses them (every provider
// here leaves the key to the application: no FI_MR_PROV_KEY).
func TestKeysAreRandom(t *testing.T) {
	for _, prov := range []string{"shm", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			m := newManager(t, transport.WithProviders(prov))
			mem, err := mr.Alloc(4096)
			require.NoError(t, err)
			defer mr.Free(mem)
			seen := map[uint64]bool{}
			var prev uint64
			sequential := 0
			for i := 0; i < 10000; i++ {
				b, err := m.Register(mem, mr.ReadWrite)
				require.NoError(t, err)
				key := providerKey(t, b.Remote(), prov)
				require.False(t, seen[key], "key %#x repeated at registration %d", key, i)
				seen[key] = true
				if key == prev+1 || key+1 == prev {
					sequential++
				}
				prev = key
				if i%2 == 0 {
					require.NoError(t, b.Close()) // churn: keys of closed buffers are not reused either
				}
			}
			assert.Zero(t, sequential, "sequential keys")
		})
	}
}

func providerKey(t *testing.T, h transport.RemoteBuffer, prov string) uint64 {
	b, err := json.Marshal(h)
	require.NoError(t, err)
	var v struct {
		Endpoints []struct {
			Provider string `json:"provider"`
			Key      uint64 `json:"key,string"`
		} `json:"endpoints"`
	}
	require.NoError(t, json.Unmarshal(b, &v))
	for _, e := range v.Endpoints {
		if e.Provider == prov {
			return e.Key
		}
	}
	t.Fatalf("no %s endpoint in the handle", prov)
	return 0
}
