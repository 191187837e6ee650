package perftest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// Marker is the value the last byte of a pingpong buffer takes in
// iteration i: never 0, different from the previous one.
func Marker(i int) byte { return byte(i%255 + 1) }

// WaitByte spins until the last byte of b equals want, as ib_write_lat
// watches its buffer; the peer's RMA write changes it. It reads the byte
// with an atomic load of its aligned word (mr.Word32), so the compiler
// cannot hoist the read out of the loop. poll, when set, is called between reads: the
// watcher drives progress (Manager.PollRoute), as fabtests' pingpong does by
// polling its CQ. stalled, when set, is asked whether to give up once
// the wait has lasted a second, then every quarter second: a pingpong
// whose peer went away ends with stalled's error instead of the timeout.
// Both run from WaitByte's first check of the clock, 1024 looks in.
func WaitByte(ctx context.Context, b []byte, want byte, timeout time.Duration, poll func(), stalled func() error) error {
	if ctx == nil {
		return errNilContext("WaitByte")
	}
	word, shift := mr.Word32(b, len(b)-1)
	// The clock is read at the first check, 1024 looks in, not before the
	// first look: most waits of a pingpong end sooner, and the read cost
	// as much as a look. The timeout runs from that check: 1024 looks
	// late, microseconds in a pingpong, up to a second where each look
	// is a passive loop's Poll (a millisecond at most).
	var start, deadline, nextCheck time.Time
	for i := 0; ; i++ {
		if byte(atomic.LoadUint32(word)>>shift) == want {
			return nil
		}
		if poll != nil {
			poll()
		}
		if i&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
			now := time.Now()
			if start.IsZero() {
				start, deadline, nextCheck = now, now.Add(timeout), now.Add(stallAfter)
			}
			if now.After(deadline) {
				return fmt.Errorf("the peer's write did not arrive within %v", timeout)
			}
			if stalled != nil && now.After(nextCheck) {
				if err := stalled(); err != nil {
					return fmt.Errorf("the peer's write did not arrive within %v: %w", now.Sub(start).Round(time.Millisecond), err)
				}
				nextCheck = time.Now().Add(stallEvery)
			}
			runtime.Gosched()
		}
	}
}

// pollRoute is what a pingpong's watcher polls between its reads: the
// backends of the route its own writes to the peer take, which the
// peer's writes back take too, not every endpoint of the manager
// (Manager.PollRoute). Where the peer writes back over another route
// (cma reaches one way only, say), that route's own loop progresses it.
func pollRoute(m *transport.Manager, rt transport.Route) func() {
	return func() { m.PollRoute(rt) }
}

// WaitByte's stall checks: the first after stallAfter, then every
// stallEvery. Far above a pingpong's round trip, so the checks never
// run in a healthy one.
const (
	stallAfter = time.Second
	stallEvery = 250 * time.Millisecond
)
