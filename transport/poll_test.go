package transport_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/transport"
)

// TestPollProviderPollsItsRoute: a caller spinning with PollProvider runs
// a round of that provider's endpoint at every call, and of the others
// at most every 100 µs (progress's idlePollEvery) — enough to keep them
// progressed, without a cgo round each at every look of a pingpong.
func TestPollProviderPollsItsRoute(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	testenv.RequireRoute(t, testenv.RouteTCP)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
	waitParked(t, m, "idle")
	const n = 20000
	spin := func(provider string) (rounds map[string]uint64, elapsed time.Duration) {
		before, start := transport.LoopRounds(m), time.Now()
		for i := 0; i < n; i++ {
			m.PollProvider(provider)
		}
		elapsed, rounds = time.Since(start), transport.LoopRounds(m)
		for p := range rounds {
			rounds[p] -= before[p]
		}
		return rounds, elapsed
	}
	// At 99% of the calls at least: the loop's own goroutine, woken by
	// the first, may hold the endpoint at some.
	rounds, _ := spin(testenv.RouteTCP)
	assert.GreaterOrEqual(t, rounds[testenv.RouteTCP], uint64(n-n/100), "rounds of the polled provider's endpoint in %d calls", n)
	// The tcp loop runs at most one round per due poll, plus one per
	// millisecond of its own while callers poll it; rounds are counted
	// to within 16 at each end.
	for _, p := range []string{testenv.RouteSHM, "mem"} {
		rounds, elapsed := spin(p)
		limit := 2 + uint64(elapsed/(100*time.Microsecond)) + uint64(elapsed/time.Millisecond) + 32
		assert.LessOrEqual(t, rounds[testenv.RouteTCP], limit, "rounds of the tcp endpoint in %d calls for %s over %v", n, p, elapsed)
	}
}
