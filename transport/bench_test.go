package transport_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// benchPeer starts a peer process on prov with a 1 MiB buffer, and a
// manager forced onto prov with a 1 MiB buffer of its own.
func benchPeer(b *testing.B, prov string) (*transport.Manager, transport.RemoteBuffer, *transport.Buffer) {
	m := newManager(b, transport.WithProviders(prov))
	peer := testpeer.Start(b, prov)
	remote := peer.Register(1<<20, mr.ReadWrite, 1)
	local := register(b, m, alloc(b, 1<<20), 0)
	return m, remote, local
}

// BenchmarkTransfer measures one synchronous transfer at a time with a
// peer process, per provider and size: MB/s (decimal) and allocations per
// op. `make bench` prints it next to the peer tools.
func BenchmarkTransfer(b *testing.B) {
	benchCases(b, []int{8, 4 << 10, 64 << 10, 1 << 20}, func(b *testing.B, m *transport.Manager, read bool,
		l *transport.Buffer, r transport.RemoteBuffer) {
		ctx := context.Background()
		measure(b, int64(l.Len()), func() error {
			if read {
				return m.ReadInto(ctx, l, r)
			}
			return m.WriteFrom(ctx, r, l)
		})
	})
}

// BenchmarkAction measures windows of 64 ops submitted as one Action, as
// `fitransfer read|write` and fi_rma_bw do: per-op MB/s and allocations
// per window.
func BenchmarkAction(b *testing.B) {
	const window = 64
	benchCases(b, []int{8, 4 << 10, 64 << 10}, func(b *testing.B, m *transport.Manager, read bool,
		l *transport.Buffer, r transport.RemoteBuffer) {
		ctx := context.Background()
		a := m.NewAction().AllowOverlap()
		measure(b, int64(l.Len())*window, func() error {
			a.Reset()
			for k := 0; k < window; k++ {
				if read {
					a.ReadInto(l, r)
				} else {
					a.WriteFrom(r, l)
				}
			}
			return a.Submit(ctx)
		})
	})
}

// benchCases runs body as a sub-benchmark "ReadInto|WriteFrom/PROVIDER/SIZE"
// for every provider (one peer process each), op and size, with local and
// remote slices of that size.
func benchCases(b *testing.B, sizes []int, body func(b *testing.B, m *transport.Manager, read bool,
	l *transport.Buffer, r transport.RemoteBuffer)) {
	for _, prov := range providers {
		m, remote, local := benchPeer(b, prov)
		for _, op := range []string{"ReadInto", "WriteFrom"} {
			for _, size := range sizes {
				b.Run(fmt.Sprintf("%s/%s/%d", op, prov, size), func(b *testing.B) {
					l, _ := local.Slice(0, uint64(size))
					r, _ := remote.Slice(0, uint64(size))
					body(b, m, op == "ReadInto", l, r)
				})
			}
		}
	}
}

// measure calls run once to connect and warm up, then b.N times, with
// bytesPerCall bytes moved by each call.
func measure(b *testing.B, bytesPerCall int64, run func() error) {
	if err := run(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(bytesPerCall)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := run(); err != nil {
			b.Fatal(err)
		}
	}
}
