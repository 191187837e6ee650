//go:build !race

package test

// raceEnabled: the race detector is off, and RSS is bounded.
const raceEnabled = false
