package libfabric

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// TestPeerWhoseRegionIsGone: an shm peer that answered once, was
// forgotten, and closed its endpoint (its region file unlinked) is not
// inserted again: Peer fails with ErrPeerGone, every time. Inserted
// again, libfabric 1.x's shm took it with no region and crashed at the
// next op (the slot kept the old handshake).
// TestPeerNeverMapped covers a name that never had a region.
func TestPeerWhoseRegionIsGone(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	mem, err := mr.Alloc(2 * 4096)
	require.NoError(t, err)
	t.Cleanup(func() { mr.Free(mem) }) // after the routes close
	initiator := openWith(t, fabric.BackendSHM, shmHints())
	imr, err := initiator.Register(mr.HostRegion(mem[:4096], 0))
	require.NoError(t, err)
	defer initiator.Do(func() { _ = imr.Close() })

	write := func(o *Route, omr *fabric.MR, off int) error {
		return write8(initiator, imr, mem, o, omr, mem[off:], Delivered)
	}
	infos, err := fabric.GetInfo(fabric.Query{Hints: shmHints()})
	require.NoError(t, err)
	gone, err := Open(0, &infos[0], "test", "forced", progress.DefaultPollPolicy, zerolog.Nop(), 0)
	require.NoError(t, err)
	gmr, err := gone.Register(mr.HostRegion(mem[4096:8192], mr.ReadWrite))
	require.NoError(t, err)
	require.NoError(t, write(gone, gmr, 4096), "the first write")
	name := gone.EndpointName()
	require.FileExists(t, "/dev/shm/"+strings.TrimRight(string(name[strings.Index(string(name), "://")+3:]), "\x00"),
		"shm's region file, where shmRegionExists looks")

	initiator.Forget(name)
	// The write's last use of the peer may end after Forget, which then
	// removes it: before its owner closes, as between two processes
	// (in one, shm keeps a pointer to the owner's region).
	require.Eventually(t, func() bool {
		initiator.mu.Lock()
		defer initiator.mu.Unlock()
		return initiator.peers[string(name)] == nil
	}, 10*time.Second, time.Millisecond, "the peer was not forgotten")
	require.NoError(t, gone.Do(func() { _ = gmr.Close() }))
	require.NoError(t, gone.Close())
	for range 2 {
		_, err = initiator.Peer(name)
		require.ErrorIs(t, err, errclass.ErrPeerGone)
		assert.Contains(t, err.Error(), "no longer exists")
		var pg *progress.PeerGoneError
		require.ErrorAs(t, err, &pg, "the type every route's peer-gone errors have")
		assert.NotEmpty(t, pg.Cause)
	}
}

// TestPeerNeverMapped: an shm name whose region file never existed is
// refused with ErrPeerGone and not inserted, so that it leaves nothing in
// shm's map. Inserted and removed again, on libfabric 1.x it stayed in
// shm's map, in the slot the next peer took: after that peer was
// forgotten and needed again, it and the peer after it got one address.
func TestPeerNeverMapped(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	in := openWith(t, fabric.BackendSHM, shmHints())
	c, d := openWith(t, fabric.BackendSHM, shmHints()), openWith(t, fabric.BackendSHM, shmHints())
	never := make([]byte, len(c.EndpointName()))
	copy(never, fmt.Sprintf("fi_shm://%d:%d:4242", os.Getpid(), os.Getuid()))
	for range 2 {
		_, err := in.Peer(never)
		require.ErrorIs(t, err, errclass.ErrPeerGone)
	}
	pc, err := in.Peer(c.EndpointName())
	require.NoError(t, err)
	pc.Done()
	in.Forget(c.EndpointName()) // unused: removed at once
	pc, err = in.Peer(c.EndpointName())
	require.NoError(t, err)
	defer pc.Done()
	pd, err := in.Peer(d.EndpointName())
	require.NoError(t, err)
	defer pd.Done()
	require.NotEqual(t, pc.addr, pd.addr, "two peers share one address")
}

// TestShmRegionExists: only a regular file of this user in /dev/shm,
// named by digits and colons after the prefix, counts.
func TestShmRegionExists(t *testing.T) {
	name := fmt.Sprintf("%d:%d:4243", os.Getpid(), os.Getuid())
	path := "/dev/shm/" + name
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	t.Cleanup(func() { _ = os.Remove(path) })
	require.NoError(t, os.Symlink(path, path+"1"))
	t.Cleanup(func() { _ = os.Remove(path + "1") })
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"fi_shm://" + name, true},
		{"fi_shm://" + name + "\x00\x00", true},
		{"fi_shm://" + name + "1", false}, // a symlink
		{"fi_shm://" + name + "\x00x", false},
		{"fi_shm://../shm/" + name, false},
		{"fi_ns://" + name, false},
		{"fi_shm://", false},
	} {
		assert.Equal(t, tt.want, shmRegionExists([]byte(tt.name)), "%q", tt.name)
	}
}

// TestShmNameOf: only the exact name of an shm endpoint of the given
// process and this user, with its one NUL, is taken from a peer.
func TestShmNameOf(t *testing.T) {
	uid := os.Geteuid()
	good := fmt.Sprintf("fi_shm://123:%d:4\x00", uid)
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{good, true},
		{strings.TrimSuffix(good, "\x00"), false},                  // no NUL: libfabric would read past it
		{good + "\x00", false},                                     // more than one
		{strings.Replace(good, ":4\x00", ":4\x00X\x00", 1), false}, // a NUL inside: another name for libfabric
		{fmt.Sprintf("fi_shm://124:%d:4\x00", uid), false},         // another process
		{fmt.Sprintf("fi_shm://123:%d:4\x00", uid+1), false},       // another user
		{fmt.Sprintf("fi_shm://123:%d\x00", uid), false},
		{fmt.Sprintf("fi_shm://123:%d:4:5\x00", uid), false},
		{fmt.Sprintf("fi_shm://123:%d:-4\x00", uid), false},
		{fmt.Sprintf("fi_shm://123:%d:\x00", uid), false},
		{fmt.Sprintf("fi_shm://123:%d:12345678901\x00", uid), false},
		{fmt.Sprintf("shm://123:%d:4\x00", uid), false},
		{fmt.Sprintf("fi_shm://../123:%d:4\x00", uid), false},
	} {
		assert.Equal(t, tc.ok, ShmNameOf([]byte(tc.name), 123), "%q", tc.name)
	}
}
