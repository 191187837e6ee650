package transport_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestCloseWhileVerifying: Close, while a request or a Route waits for
// a stopped owner to answer its verification, ends that wait with
// ErrClosed and returns, however far the request's deadline is; a
// request made once Close began fails with ErrClosed at once.
func TestCloseWhileVerifying(t *testing.T) {
	for _, call := range []string{"ReadInto", "Route"} {
		t.Run(call, func(t *testing.T) {
			testenv.RequireRoute(t, testenv.RouteMem)
			m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteMem), transport.WithTimeout(time.Minute))
			require.NoError(t, err)
			owner := testpeer.Start(t, testenv.RouteMem)
			h := owner.Register(4096, mr.ReadWrite, 1)
			local := register(t, m, alloc(t, 4096), mr.ReadWrite)
			owner.Stop()
			defer owner.Continue()

			waited := make(chan error, 1)
			go func() {
				if call == "Route" {
					_, err := m.Route(h)
					waited <- err
					return
				}
				waited <- m.ReadInto(context.Background(), local, h)
			}()
			require.Eventually(t, func() bool { return transport.VerificationsUnderWay(m) > 0 },
				10*time.Second, time.Millisecond, "the verification never began")

			closed := make(chan error, 1)
			go func() { closed <- m.Close() }()
			select {
			case err = <-waited:
			case <-time.After(10 * time.Second):
				t.Fatalf("%s still waits for the stopped owner 10 s after Close began", call)
			}
			assert.ErrorIs(t, err, transport.ErrClosed, "%s", call)
			assert.NotErrorIs(t, err, transport.ErrTimeout)
			select {
			case <-closed:
			case <-time.After(10 * time.Second):
				t.Fatal("Close hangs while a verification is under way")
			}
			assert.ErrorIs(t, m.ReadInto(context.Background(), local, h), transport.ErrClosed)
		})
	}
}
