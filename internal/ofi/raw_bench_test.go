package ofi

import (
	"testing"
	"unsafe"
)

// BenchmarkRawRead is the floor under fitransfer's shm path: one 8-byte
// fi_read posted and reaped in a spin, between two endpoints of this
// process.
func BenchmarkRawRead(b *testing.B) {
	for _, prov := range []string{"shm", "tcp;ofi_rxm"} {
		b.Run(prov, func(b *testing.B) {
			info := rmaInfo(b, prov, 0)
			a, t := openSide(b, info), openSide(b, info)
			peer, _ := a.ep.InsertAddr(t.ep.Name())
			src, dst := mmap(b, 4096), mmap(b, 4096)
			mrT, _ := t.d.RegMR(uintptr(unsafe.Pointer(&src[0])), 4096, AccessRemoteRead|AccessRemoteWrite, 7, HMEMSystem, 0, nil)
			mrA, _ := a.d.RegMR(uintptr(unsafe.Pointer(&dst[0])), 4096, AccessRead|AccessWrite, 8, HMEMSystem, 0, nil)
			defer mrT.Close()
			defer mrA.Close()
			remote := uint64(0)
			if info.Domain.MRMode.Has(MRVirtAddr) {
				remote = uint64(uintptr(unsafe.Pointer(&src[0])))
			}
			op := Op{Local: uintptr(unsafe.Pointer(&dst[0])), Len: 8, Desc: mrA.Desc(), Remote: remote, Key: mrT.Key(), Peer: peer, Flags: uint64(OpCompletion), Slot: 1}
			a.q.Set(0, &op)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for {
					if n, _ := a.q.Post(a.ep, 1); n == 1 {
						break
					}
					_, _ = a.q.Reap(a.ep)
					_, _ = t.q.Reap(t.ep)
				}
				for {
					s, _ := a.q.Reap(a.ep)
					if len(s) == 1 {
						break
					}
					_, _ = t.q.Reap(t.ep)
				}
				if i&63 == 0 {
					_, _ = t.q.Reap(t.ep)
				}
			}
		})
	}
}

// rawProviders are the providers BenchmarkIdleReap measures.
var rawProviders = []string{"shm", "tcp;ofi_rxm"}

// BenchmarkIdleReap is one fi_cq_read of an idle endpoint: what a loop
// spinning on an endpoint pays at each look.
func BenchmarkIdleReap(b *testing.B) {
	for _, prov := range rawProviders {
		b.Run(prov, func(b *testing.B) {
			s := openSide(b, rmaInfo(b, prov, 0))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = s.q.Reap(s.ep)
			}
		})
	}
}
