package progress

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkIdleRound is the loop's own cost of a round that finds nothing
// (what a caller spinning on memory pays at each look, and a waiter at
// each round before its completion), over a fake endpoint whose reap
// costs an atomic add and a lock.
func BenchmarkIdleRound(b *testing.B) {
	f := newFakePort()
	l := newLoop(f, 4, PollPolicy{MinSleep: time.Hour, MaxSleep: time.Hour}, zerolog.Nop())
	go l.run()
	defer l.Close(nil)
	b.ReportAllocs()
	for b.Loop() {
		l.PollIfWanted()
	}
}
