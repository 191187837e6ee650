package libfabric

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPIDSetForgetsGoneProcesses: the set of processes a 1.x shm endpoint
// sent to stays about the size of the live ones however many gone peers
// it met, and never drops a live one.
func TestPIDSetForgetsGoneProcesses(t *testing.T) {
	// Above any pid the kernel hands out (pid_max is at most 2^22): gone.
	const gone = 1 << 23
	var s pidSet
	live := []int{1, os.Getpid()}
	for _, pid := range live {
		s.note(pid)
	}
	for i := range 10_000 {
		s.note(gone + i)
		s.pruned.Wait() // the prunes run beside the notes: wait for each here
		require.LessOrEqual(t, len(s.pids), 2*prunePIDsFrom, "after %d gone peers", i+1)
	}
	got := s.list()
	for _, pid := range live {
		assert.Contains(t, got, pid)
	}
	s.note(os.Getpid()) // again: once
	assert.Len(t, s.list(), len(got))
}
