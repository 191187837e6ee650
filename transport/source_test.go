package transport_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/transport"
)

// newWithSource is a child that opens a manager with a source address,
// with the providers its arguments name (none: fitransfer's choice), and
// answers "ok" or why not.
func init() {
	testpeer.Register("new with source", func(conn io.ReadWriter, args []string) error {
		opts := []transport.Option{transport.WithSourceAddress("127.0.0.1")}
		if len(args) > 0 {
			opts = append(opts, transport.WithProviders(args...))
		}
		m, err := transport.New(context.Background(), opts...)
		if err != nil {
			fmt.Fprintln(conn, err)
			return nil
		}
		fmt.Fprintln(conn, "ok")
		return m.Close()
	})
}

// TestSourceAddressWithoutTCP: a source address binds tcp only, so a
// manager that cannot have tcp (FI_PROVIDER leaves it out, which
// libfabric reads once a process: in a child) or is not to (its forced
// providers leave it out) opens with one all the same. The CLI gives one
// always, and failed under FI_PROVIDER=shm with every -p (a new user's
// review: "tcp;ofi_rxm on source address …: No data available").
func TestSourceAddressWithoutTCP(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	t.Setenv("FI_PROVIDER", "shm")
	for _, providers := range [][]string{nil, {testenv.RouteSHM}, {testenv.RouteCMA}, {testenv.RouteMem}} {
		p, err := testpeer.StartFunc("new with source", providers...)
		require.NoError(t, err)
		got, err := p.ReadLine()
		require.NoError(t, err)
		assert.Equal(t, "ok", got, "providers %v", providers)
		require.NoError(t, p.Close())
	}
}
