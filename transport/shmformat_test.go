package transport_test

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// shmOwnerOfAnotherFormat is a child with a manager over shm and tcp
// whose shm region says, in its first byte, another format than this
// libfabric's (as a process of another libfabric version's would): it
// prints the handle of 64 bytes of 0x5a, and exits at the end of its
// input.
func init() {
	testpeer.Register("shm owner of another format", func(conn io.ReadWriter, _ []string) error {
		m, err := transport.New(context.Background(), transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
		if err != nil {
			return err
		}
		defer m.Close()
		region := "/dev/shm/" + strings.TrimPrefix(strings.TrimRight(transport.FirstShmAddress(m), "\x00"), "fi_shm://")
		f, err := os.OpenFile(region, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteAt([]byte{99}, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return serveFilled(conn, m, 64, 0x5a)
	})
}

// TestShmOfAnotherFormat: an owner whose shm speaks another format than
// this process's (libfabric 1.17's and 2.x's differ, and shm checks no
// peer's) is not reached over shm: shm alone is no route, saying why,
// and with tcp too the transfer goes over tcp. A 2.1 client of a 1.17
// serve over shm crashed in its first post (a new user's review).
func TestShmOfAnotherFormat(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	testenv.RequireRoute(t, testenv.RouteTCP)
	p, err := testpeer.StartFunc("shm owner of another format")
	require.NoError(t, err)
	defer func() { require.NoError(t, p.Close(), "the owner's child") }()
	r := readHandle(t, p)

	ctx := ctxTimeout(t, 30*time.Second)
	shmOnly := newManager(t, transport.WithProviders(testenv.RouteSHM))
	local := alloc(t, 64)
	err = shmOnly.ReadInto(ctx, register(t, shmOnly, local, mr.ReadWrite), r)
	require.ErrorIs(t, err, transport.ErrNoRoute)
	assert.Contains(t, err.Error(), "in format 99")
	assert.Zero(t, local[0], "nothing read")

	both := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
	rt, err := both.Route(r)
	require.NoError(t, err)
	assert.Equal(t, testenv.RouteTCP, rt.Backend)
	require.NoError(t, both.ReadInto(ctx, register(t, both, local, mr.ReadWrite), r))
	assert.Equal(t, byte(0x5a), local[63])
}
