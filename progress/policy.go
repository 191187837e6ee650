package progress

import "time"

// PollPolicy is how a progress loop waits when nothing happens: it polls
// without pause for Spin after the last activity (a submission or a
// completion), then sleeps between polls, doubling from MinSleep up to
// MaxSleep (and while a goroutine waits on a job and so drives progress,
// it looks again every max(MaxSleep, 1ms)). A submission does not wake
// it: the goroutine that waits for the job drives progress itself
// (Loop.Wait), and a job nobody waits for starts within MaxSleep. On a
// passive loop (shm: its calls may never return) waiters never drive:
// each kicks the loop's goroutine, which runs a round per kick while
// they wait.
// Endpoints whose completion queue wakes on incoming traffic (tcp) block
// on the CQ's wait fd instead of sleeping, for at most MaxSleep.
//
// Once nothing of the loop's own is running (no job, no op in flight) and
// Spin has passed, it parks instead of polling, where that cannot keep a
// peer waiting: on the CQ's wait fd until traffic, a signal or a second passes
// when the completion queue wakes on traffic; until woken, when no peer
// attends (Loop.ParkWhenUnattended). A parked loop costs no CPU; each
// poll every MaxSleep costs a timer wake-up, and a thousand a second took
// several percent of a core.
type PollPolicy struct {
	Spin     time.Duration
	MinSleep time.Duration
	MaxSleep time.Duration
	// WedgeAfter is how long one libfabric call may run before its
	// endpoint counts as wedged (Loop.Wedged); 0 means WedgeAfter.
	WedgeAfter time.Duration
}

// DefaultPollPolicy spins for 2 ms after activity and then polls at least
// every millisecond, or parks (see PollPolicy): targets serve peers within
// about a millisecond while idle and use little CPU.
var DefaultPollPolicy = PollPolicy{Spin: DefaultSpin, MinSleep: 50 * time.Microsecond, MaxSleep: time.Millisecond}

// DefaultSpin is DefaultPollPolicy's Spin.
const DefaultSpin = 2 * time.Millisecond

// BusyPollPolicy never sleeps (as fabtests do): lowest latency, one core
// per endpoint.
var BusyPollPolicy = PollPolicy{Spin: 1<<63 - 1}

func (p PollPolicy) normalized() PollPolicy {
	if p.MinSleep <= 0 {
		p.MinSleep = DefaultPollPolicy.MinSleep
	}
	if p.MaxSleep < p.MinSleep {
		p.MaxSleep = p.MinSleep
	}
	if p.WedgeAfter <= 0 {
		p.WedgeAfter = WedgeAfter
	}
	return p
}
