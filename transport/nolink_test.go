package transport_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// ownerWithoutLinks is a child whose manager (mem, cma, shm and tcp)
// refuses every peer's link (no use page to hand out): it prints the
// handle of 64 KiB of 0x5a, and exits at the end of its input.
func init() {
	testpeer.Register("owner without links", func(conn io.ReadWriter, _ []string) error {
		defer transport.SetMaxMemPeers(0)()
		m, err := transport.New(context.Background(), transport.WithProviders(
			testenv.RouteMem, testenv.RouteCMA, testenv.RouteSHM, testenv.RouteTCP))
		if err != nil {
			return err
		}
		defer m.Close()
		return serveFilled(conn, m, 64<<10, 0x5a)
	})
}

// TestSameNodeWithoutLink: an owner's Close waits for this manager's
// same-node ops only through the link it hands out (its use page): over
// shm, ops it did not count went on copying into the buffer's memory
// after its Close had freed it, and the owner crashed
// (TestShmOwnerClosesUnderAWrite). Toward an owner that refuses the link
// no same-node route is taken: alone, each is no route, saying why, and
// nothing moves; with tcp too the transfer goes over tcp.
func TestSameNodeWithoutLink(t *testing.T) {
	for _, r := range []string{testenv.RouteMem, testenv.RouteCMA, testenv.RouteSHM, testenv.RouteTCP} {
		testenv.RequireRoute(t, r)
	}
	p, err := testpeer.StartFunc("owner without links")
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close(), "the owner's child") }()
	h := readHandle(t, p)

	for _, same := range []string{testenv.RouteMem, testenv.RouteCMA, testenv.RouteSHM} {
		t.Run(same, func(t *testing.T) {
			ctx := ctxTimeout(t, 30*time.Second)
			alone := newManager(t, transport.WithProviders(same))
			local := alloc(t, 64<<10)
			err := alone.ReadInto(ctx, register(t, alone, local, mr.ReadWrite), h)
			require.ErrorIs(t, err, transport.ErrNoRoute)
			t.Log(err)
			assert.Contains(t, err.Error(), "the link its Close waits for this manager's ops through failed")
			assert.Contains(t, err.Error(), "the owner has no use page left")
			assert.Zero(t, local[len(local)-1], "nothing read")

			withTCP := newManager(t, transport.WithProviders(same, testenv.RouteTCP))
			rt, err := withTCP.Route(h)
			require.NoError(t, err)
			assert.Equal(t, testenv.RouteTCP, rt.Backend)
			assert.Contains(t, rt.Reason, "the link its Close waits for this manager's ops through failed")
			require.NoError(t, withTCP.ReadInto(ctx, register(t, withTCP, local, mr.ReadWrite), h))
			assert.Equal(t, byte(0x5a), local[len(local)-1])
		})
	}
}
