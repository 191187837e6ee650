package libfabric

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
)

// TestSelfCheck: an shm route reads its own guard table through its own
// endpoint, and the bytes are the table's; shm needs the check on every
// libfabric (a dead peer can block it unseen: 1.x's region lock,
// test/TestInitiatorKilled; 2.x's command queue,
// test/TestInitiatorKilledMidCommand).
func TestSelfCheck(t *testing.T) {
	r := open(t, fabric.BackendSHM)
	table, err := mr.Alloc(4096)
	require.NoError(t, err)
	for i := range table {
		table[i] = byte(i*7 + 1)
	}
	const entry = 64
	require.NoError(t, r.RegisterScratch(table, entry, 4))
	t.Cleanup(func() { // before open's Close, a no-op then
		require.NoError(t, r.Close())
		r.FreeScratch()
		require.NoError(t, mr.Free(table))
	})
	assert.True(t, r.SelfCheckNeeded())
	for range 3 { // the first inserts the route's own address
		require.NoError(t, r.SelfCheck(context.Background()))
	}
	// Every slot comes back: a fourth check would wait for one otherwise.
	// The loop drops its hold on a job (and the job's slot) right after it
	// wakes the job's waiter, so the last check's slot may come a moment
	// after SelfCheck returned.
	assert.Eventually(t, func() bool { return len(r.Scratch.slots) == 4 }, 10*time.Second, time.Millisecond,
		"scratch slots back after the checks")
	assert.Equal(t, table[:entry], r.Scratch.entry(0)[:entry], "what the read brought")
}
