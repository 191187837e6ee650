package transport_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestEndedLinksKeepNothing: a mem link to an owner that died leaves
// nothing of it in the initiator once its ops are done — no pidfd, no
// mapping of the owner's files (its generations, its use page, its
// buffers). A long-lived process reaches any number of owners over its
// life; each used to keep a pidfd and two mappings for good.
func TestEndedLinksKeepNothing(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	const owners = 12
	m := newManager(t, transport.WithProviders(testenv.RouteMem))
	local := register(t, m, alloc(t, 4096), 0)
	ctx := ctxTimeout(t, time.Minute)
	base := ownerResources(t)
	for i := range owners {
		peer := testpeer.Start(t, testenv.RouteMem)
		h := peer.Register(4096, mr.ReadWrite, uint64(i+1))
		require.NoError(t, m.ReadInto(ctx, local, h))
		require.Equal(t, testpeer.Pattern(4096, uint64(i+1)), local.Bytes())
		peer.Kill()
		require.ErrorIs(t, m.ReadInto(ctx, local, h), transport.ErrPeerGone)
	}
	// The links end when the initiator's connection to each owner's
	// verifier does, which it learns on its own goroutine.
	for deadline := time.Now().Add(30 * time.Second); ; {
		now := ownerResources(t)
		if now.pidfds <= base.pidfds && now.memfdMaps <= base.memfdMaps {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %d owners died: pidfds %d -> %d, memfd mappings %d -> %d", owners, base.pidfds, now.pidfds, base.memfdMaps, now.memfdMaps)
		}
		time.Sleep(time.Millisecond) // a poll of /proc, not a stand-in for a signal
	}
}

type resources struct{ pidfds, memfdMaps int }

// ownerResources counts this process's pidfds and its mappings of memfd
// files (an owner's generations, use page and buffers are memfds; so are
// this process's own registrations, which the test keeps constant).
func ownerResources(t *testing.T) resources {
	var r resources
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.Contains(target, "pidfd") {
			r.pidfds++
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	r.memfdMaps = strings.Count(string(maps), "/memfd:")
	return r
}
