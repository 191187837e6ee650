package transport

import (
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/progress"
)

// TestReplacedOwnerEndedLink: an op that meets the ended mem route to an
// owner this manager verified again (replaced: it ended the verified
// connection itself, and its watcher closed the link without marking the
// owner gone) fails as a memLinkEnded — nothing moved, retryable — while
// the OS says the owner lives, and with ErrPeerGone once the OS says it
// exited, or when the owner's side ended the connection (gone): at the
// mapping (get) and at the copy (memCopy). At the link (memLink) a
// replaced owner's is a memLinkEnded either way: route then takes the new
// verification, which finds an owner that exited gone.
func TestReplacedOwnerEndedLink(t *testing.T) {
	exited := exec.Command("true")
	require.NoError(t, exited.Run()) // reaped: its pid names no process
	for _, tt := range []struct {
		name           string
		pid            int
		replaced, gone bool
		wantGone       bool // from get and memCopy
	}{
		{name: "replaced, the owner lives", pid: os.Getpid(), replaced: true},
		{name: "replaced, the owner exited", pid: exited.Process.Pid, replaced: true, wantGone: true},
		{name: "the owner's side ended it", pid: os.Getpid(), gone: true, wantGone: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := &sameNodePeer{pid: tt.pid, memDone: true} // closeMem ran
			p.replaced.Store(tt.replaced)
			p.gone.Store(tt.gone)
			check := func(where string, err error, wantGone bool) {
				t.Helper()
				var gone *progress.PeerGoneError
				var ended *memLinkEnded
				if wantGone {
					require.ErrorAs(t, err, &gone, where)
					if where != "memLink" {
						require.Equal(t, mem.Name, gone.Provider, "%s: %v", where, err)
					}
					return
				}
				require.ErrorAs(t, err, &ended, where)
				require.False(t, errors.As(err, &gone), "%s: a live owner reported gone: %v", where, err)
				require.True(t, Retryable(err), "%s: %v", where, err)
			}

			_, err := p.memLink(testTimes())
			check("memLink", err, !tt.replaced)

			// The link's pidfd is -1 and it has no lifeline: the OS is
			// asked about the pid (alive).
			g := &guardRef{slot: 3, gen: 5}
			l := &memLink{owner: p, pidfd: -1, gens: make([]uint64, 8), uses: make(mem.Uses, 8), maps: map[uint64]*memMap{}}
			l.gens[g.slot] = g.gen
			l.done.Store(true)
			_, err = l.get(testTimes(), &RemoteBuffer{id: 1, size: 8, n: 8}, &remoteEP{guard: g})
			check("get", err, tt.wantGone)

			local, remote := make([]byte, 8), []byte("12345678")
			err = (&Manager{}).memCopy(route.Limit{}, progress.Read, local, remote, l, g, p, 1)
			check("memCopy", err, tt.wantGone)
			require.Equal(t, make([]byte, 8), local, "a copy moved bytes over an ended link")
			require.False(t, l.uses.InUse(g.slot), "the copy left its mark")
		})
	}
}
