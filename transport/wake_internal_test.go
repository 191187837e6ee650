package transport

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestWakeOwnerStopsForOlderOwners: a peer wakes the owner at most once
// per wakeAfter, and stops for good once the owner answered a wake (an
// owner of an earlier version refuses the byte, and nobody reads its
// answers: they would fill the connection).
func TestWakeOwnerStopsForOlderOwners(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fds[0]), "peer")
	nc, err := net.FileConn(f)
	f.Close()
	require.NoError(t, err)
	owner := os.NewFile(uintptr(fds[1]), "owner")
	t.Cleanup(func() { nc.Close(); owner.Close() })
	p := &sameNodePeer{annConn: nc.(*net.UnixConn)}
	// The owner's proof comes first on every connection: not an answer.
	_, err = owner.Write([]byte(proofMagic + "pid, table, name"))
	require.NoError(t, err)

	pending := func() int {
		n, err := unix.IoctlGetInt(fds[1], unix.SIOCINQ)
		require.NoError(t, err)
		return n
	}
	p.wakeOwner(time.Now()) // the first op: a wake
	p.shmAt.Store(int64(time.Since(clockStart)))
	p.wakeOwner(time.Now()) // within wakeAfter of the last op: nothing
	assert.Equal(t, 1, pending(), "one wake")
	b := make([]byte, 64)
	n, err := owner.Read(b)
	require.NoError(t, err)
	assert.Equal(t, []byte{announceWake}, b[:n])

	p.shmAt.Add(-int64(2 * wakeAfter)) // an idle spell
	p.wakeOwner(time.Now())
	n, err = owner.Read(b)
	require.NoError(t, err)
	assert.Equal(t, []byte{announceWake}, b[:n], "a wake after an idle spell")

	// An older owner answers with a refusal: the next wake finds it
	// and stops.
	_, err = owner.Write([]byte("refused: unknown or out-of-order request"))
	require.NoError(t, err)
	for range 3 {
		p.shmAt.Add(-int64(2 * wakeAfter))
		p.wakeOwner(time.Now())
	}
	assert.Zero(t, pending(), "no wake once the owner answered one")
}
