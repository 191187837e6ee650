//go:build race

package testenv

// RaceEnabled reports whether the race detector is on: it allocates for
// its own bookkeeping, so tests that count allocations skip under it.
const RaceEnabled = true
