package test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// `make soak` runs these for a minute; `make test` for 10 s.
var (
	soakFor   = flag.Duration("soak", 10*time.Second, "how long TestSoak transfers")
	churnBufs = flag.Int("churn", 100000, "buffers TestChurn registers and closes")
)

// Leak bounds, after the work and once the goroutines settled.
const (
	maxGoroutineGrowth = 0
	maxFDGrowth        = 0
	maxRSSGrowth       = 64 << 20
	maxHeapGrowth      = 16 << 20
)

const (
	soakWorkers = 8       // per provider
	soakRegion  = 1 << 20 // bytes of the owner's buffer each worker owns
)

// TestSoak: for each provider at once, soakWorkers goroutines do random
// reads and writes of random sizes at random offsets, each in its own
// region of a peer's buffer, checking every byte read against what it
// wrote; at the end each reads its whole region back. The first fifth of
// the time (at least a second) warms up — pools, heaps, the race
// detector's shadow memory reach their working size — and the leak
// figures of this process and of the peers are taken after it and at the
// end: what leaks grows with the work, a warm-up does not.
func TestSoak(t *testing.T) {
	requireRoutes(t, providers...)
	type side struct {
		prov    string
		m       *transport.Manager
		owner   *testpeer.Peer
		remote  transport.RemoteBuffer
		local   *transport.Buffer
		mem     []byte
		shadows [][]byte // per worker: what its region holds
	}
	var sides []*side
	for i, prov := range providers {
		s := &side{prov: prov, m: newManager(t, transport.WithProviders(prov))}
		s.owner = testpeer.Start(t, prov)
		s.remote = s.owner.Register(soakWorkers*soakRegion, mr.ReadWrite, uint64(10+i))
		s.local, s.mem = register(t, s.m, soakWorkers*soakRegion, mr.ReadWrite)
		require.NoError(t, s.m.ReadInto(context.Background(), s.local, s.remote)) // connected
		for w := 0; w < soakWorkers; w++ {
			s.shadows = append(s.shadows, bytes.Clone(s.mem[w*soakRegion:(w+1)*soakRegion]))
		}
		sides = append(sides, s)
	}

	var ops, verified, written atomic.Int64
	// phase runs every worker until the deadline and reports the first
	// errors through t.
	phase := func(seed uint64, d time.Duration) {
		deadline := time.Now().Add(d)
		var wg sync.WaitGroup
		errc := make(chan error, len(sides)*soakWorkers)
		for si, s := range sides {
			for w := 0; w < soakWorkers; w++ {
				wg.Add(1)
				go func(s *side, w int) {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed+uint64(si), uint64(w)))
					base := uint64(w * soakRegion)
					shadow := s.shadows[w]
					region, _ := s.remote.Slice(base, soakRegion)
					localRegion, _ := s.local.Slice(base, soakRegion)
					for time.Now().Before(deadline) {
						off := rng.Uint64N(soakRegion)
						size := 1 + rng.Uint64N(min(soakRegion-off, 1<<uint(rng.IntN(21)))) // sizes spread 1 B .. 1 MiB
						l, _ := localRegion.Slice(off, size)
						r, _ := region.Slice(off, size)
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						var err error
						if rng.IntN(2) == 0 {
							fillRandom(rng, l.Bytes())
							if err = s.m.WriteFrom(ctx, r, l); err == nil {
								copy(shadow[off:off+size], l.Bytes())
								written.Add(int64(size))
							}
						} else if err = s.m.ReadInto(ctx, l, r); err == nil {
							if !bytes.Equal(l.Bytes(), shadow[off:off+size]) {
								err = fmt.Errorf("read [%d, +%d) differs from what was written", off, size)
							}
							verified.Add(int64(size))
						}
						cancel()
						if err != nil {
							errc <- fmt.Errorf("%s worker %d: %w", s.prov, w, err)
							return
						}
						ops.Add(1)
					}
					if err := s.m.ReadInto(context.Background(), localRegion, region); err != nil {
						errc <- fmt.Errorf("%s worker %d: %w", s.prov, w, err)
						return
					}
					if !bytes.Equal(localRegion.Bytes(), shadow) {
						errc <- fmt.Errorf("%s worker %d: the region differs from what was written", s.prov, w)
					}
					verified.Add(soakRegion)
				}(s, w)
			}
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Error(err)
		}
	}

	warmFor := max(time.Second, *soakFor/5)
	start := testpeer.TakeStats()
	phase(1, warmFor)
	runtime.GC()
	before := testpeer.TakeStats()
	ownersBefore := make([]testpeer.Stats, len(sides))
	for i, s := range sides {
		ownersBefore[i] = s.owner.Stats()
	}
	phase(2, *soakFor-warmFor)
	if t.Failed() {
		return
	}
	t.Logf("soak: %v, %d providers × %d workers: %d ops, %d MB read and verified, %d MB written",
		*soakFor, len(sides), soakWorkers, ops.Load(), verified.Load()/1e6, written.Load()/1e6)

	after := settledStats(t, before)
	t.Logf("this process: goroutines %d → %d, fds %d → %d, rss %d → %d MiB after the %v warm-up → %d MiB at the end (anon %d → %d, shmem %d → %d)",
		before.Goroutines, after.Goroutines, before.FDs, after.FDs, start.RSS>>20, before.RSS>>20, warmFor, after.RSS>>20,
		before.RSSAnon>>20, after.RSSAnon>>20, before.RSSShmem>>20, after.RSSShmem>>20)
	checkLeaks(t, "this process", before, after)
	for i, s := range sides {
		a := s.owner.Stats()
		t.Logf("%s owner: goroutines %d → %d, fds %d → %d, rss %d → %d MiB", s.prov,
			ownersBefore[i].Goroutines, a.Goroutines, ownersBefore[i].FDs, a.FDs, ownersBefore[i].RSS>>20, a.RSS>>20)
		checkLeaks(t, s.prov+" owner", ownersBefore[i], a)
	}
}

// TestChurn registers and closes *churnBufs buffers on a manager with
// every backend, and checks nothing grows.
func TestChurn(t *testing.T) {
	m := newManager(t)
	mem, err := mr.Alloc(64 << 10)
	require.NoError(t, err)
	defer mr.Free(mem)
	warm, err := m.Register(mem, mr.ReadWrite)
	require.NoError(t, err)
	require.NoError(t, warm.Close())
	runtime.GC()
	before := testpeer.TakeStats()
	start := time.Now()
	for i := 0; i < *churnBufs; i++ {
		b, err := m.Register(mem[i%1024:], mr.ReadWrite)
		require.NoError(t, err)
		require.NoError(t, b.Close())
	}
	took := time.Since(start)
	after := settledStats(t, before)
	t.Logf("churn: %d registrations and closes over %d backends in %v (%.1f µs each); goroutines %d → %d, fds %d → %d, rss %d → %d MiB",
		*churnBufs, len(m.Backends()), took.Round(time.Millisecond), float64(took.Microseconds())/float64(*churnBufs),
		before.Goroutines, after.Goroutines, before.FDs, after.FDs, before.RSS>>20, after.RSS>>20)
	checkLeaks(t, "churn", before, after)
}

// settledStats measures again once the goroutines are back (deregistration
// and late completions end asynchronously), after a GC.
func settledStats(t *testing.T, before testpeer.Stats) testpeer.Stats {
	t.Helper()
	var s testpeer.Stats
	for end := time.Now().Add(10 * time.Second); ; {
		runtime.GC()
		s = testpeer.TakeStats()
		if s.Goroutines <= before.Goroutines+maxGoroutineGrowth || time.Now().After(end) {
			return s
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func checkLeaks(t *testing.T, who string, before, after testpeer.Stats) {
	t.Helper()
	assert.LessOrEqual(t, after.Goroutines, before.Goroutines+maxGoroutineGrowth, "%s: goroutines", who)
	assert.LessOrEqual(t, after.FDs, before.FDs+maxFDGrowth, "%s: open files", who)
	assert.LessOrEqual(t, after.HeapAlloc, before.HeapAlloc+maxHeapGrowth, "%s: live Go heap", who)
	if raceEnabled {
		t.Logf("%s: resident memory %d → %d MiB not bounded under -race (the race detector's own memory grows with the work); the run without -race bounds it",
			who, before.RSS>>20, after.RSS>>20)
		return
	}
	assert.LessOrEqual(t, after.RSS, before.RSS+maxRSSGrowth, "%s: resident memory", who)
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
}
