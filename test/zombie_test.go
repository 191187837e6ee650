package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestZombieOwnerIsGone: an owner that exited but was not reaped by its
// parent (a zombie, which kill(pid, 0) still finds) is a dead peer on
// every same-node route: an op toward it fails with ErrPeerGone, saying
// so, long before the deadline.
func TestZombieOwnerIsGone(t *testing.T) {
	requireRoutes(t, "cma", "shm")
	for _, route := range []string{"cma", "shm"} {
		t.Run(route, func(t *testing.T) {
			const deadline = 20 * time.Second
			m := newManager(t, transport.WithProviders(route), transport.WithTimeout(deadline))
			owner := testpeer.StartUnreaped(t, route)
			h := owner.Register(1<<20, mr.ReadWrite, 1)
			local, _ := register(t, m, 1<<20, mr.ReadWrite)
			require.NoError(t, m.ReadInto(context.Background(), local, h), "the owner answers while alive")
			owner.Zombie()
			for _, op := range []string{"read", "write"} {
				start := time.Now()
				err := transfer(context.Background(), m, op, local, h)
				took := time.Since(start)
				t.Logf("%s after %v: %v", op, took.Round(time.Millisecond), err)
				assert.ErrorIs(t, err, transport.ErrPeerGone, "%s", op)
				assert.Contains(t, fmt.Sprint(err), "zombie", "%s: the error says how the peer is known to be gone", op)
				assert.Less(t, took, 2*time.Second, "%s: known well before the %v deadline", op, deadline)
				assert.Equal(t, byte('Z'), owner.State(), "the owner is still an unreaped zombie")
			}
		})
	}
}
