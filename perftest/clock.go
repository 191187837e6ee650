package perftest

import "time"

// clockBase is monoClock's origin.
var clockBase = time.Now()

// monoClock is the time since clockBase from the monotonic clock alone:
// one clock read where time.Now makes two (wall and monotonic), which on
// the timed loops' 8 B ops is a measurable part of what they time.
func monoClock() time.Duration { return time.Since(clockBase) }

// DefaultWarmupFor is the warm-up time the CLI asks for (Config.WarmupFor):
// in runs of this VM, 8 B mem pingpongs after 25 ms of warm-up had no
// more stalls than a C pingpong's (docs/PERFORMANCE.md).
const DefaultWarmupFor = 50 * time.Millisecond
