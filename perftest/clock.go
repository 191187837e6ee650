package perftest

import "time"

// clockBase is monoClock's origin.
var clockBase = time.Now()

// monoClock is the time since clockBase from the monotonic clock alone:
// one clock read where time.Now makes two (wall and monotonic), which on
// the timed loops' 8 B ops is a measurable part of what they time.
func monoClock() time.Duration { return time.Since(clockBase) }
