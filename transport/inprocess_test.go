package transport

import (
	"bytes"
	"context"
	"math/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/mr"
)

func alloc(t testing.TB, n int) []byte {
	b, err := mr.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mr.Free(b) })
	return b
}

func newManager(t testing.TB, opts ...Option) *Manager {
	m, err := New(context.Background(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestTwoManagersInProcess(t *testing.T) {
	for _, prov := range []string{"shm", "tcp;ofi_rxm"} {
		t.Run(prov, func(t *testing.T) {
			owner := newManager(t, WithProviders(prov))
			init := newManager(t, WithProviders(prov))
			const n = 1<<20 + 13
			src := alloc(t, n)
			rand.New(rand.NewSource(1)).Read(src)
			ob, err := owner.Register(src, mr.ReadWrite)
			require.NoError(t, err)
			dst := alloc(t, n)
			ib, err := init.Register(dst, 0)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			require.NoError(t, init.ReadInto(ctx, ib, ob.Remote()))
			t.Logf("read %d bytes in %v", n, time.Since(start))
			require.True(t, bytes.Equal(src, dst))

			for i := range dst {
				dst[i] = byte(i * 3)
			}
			start = time.Now()
			require.NoError(t, init.WriteFrom(ctx, ob.Remote(), ib))
			t.Logf("write %d bytes in %v", n, time.Since(start))
			require.True(t, bytes.Equal(src, dst))
		})
	}
}
