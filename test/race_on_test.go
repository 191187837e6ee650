//go:build race

package test

// raceEnabled: the race detector is on. Its own memory (shadow words and
// access history) grows with the work and shows in the process's RSS, so
// the leak checks bound the Go heap instead; `make test` runs the soak
// and churn once more without it, where RSS is bounded.
const raceEnabled = true
