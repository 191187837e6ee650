package transport

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// linkEndedCase is one way the link a same-node op was routed with can
// have ended before the op was marked in it, and the error that op must
// fail with: nothing moved, and no mark left behind.
type linkEndedCase struct {
	name     string
	noLink   bool // the op was routed while its link was up, and it has none now
	ended    bool // the link is done: the owner may no longer count its use page
	gone     bool // the owner's side ended the verified connection
	exited   bool // the owner's pid names no process
	down     bool // this manager closes
	wantGone bool // a *progress.PeerGoneError
	wantEnd  bool // a memLinkEnded: the owner lives, retryable
	closed   bool // ErrClosed
}

var linkEndedCases = []linkEndedCase{
	{name: "link up"},
	{name: "no link, the owner lives", noLink: true, wantEnd: true},
	{name: "no link, the owner exited", noLink: true, exited: true, wantGone: true},
	{name: "link ended, the owner lives", ended: true, wantEnd: true},
	{name: "link ended, the owner's side ended it", ended: true, gone: true, wantGone: true},
	{name: "link ended, this manager closes", ended: true, down: true, closed: true},
}

// setup builds the op's owner, link and manager for tt, the owner being
// this process (or a pid that names none: exited).
func (tt linkEndedCase) setup(t *testing.T, g *guardRef) (*Manager, *sameNodePeer, *memLink) {
	t.Helper()
	pid := os.Getpid()
	if tt.exited {
		exited := exec.Command("true")
		require.NoError(t, exited.Run()) // reaped: its pid names no process
		pid = exited.Process.Pid
	}
	peer := &sameNodePeer{pid: pid}
	peer.gone.Store(tt.gone)
	l := &memLink{owner: peer, pidfd: -1, gens: make([]uint64, 8), uses: make(mem.Uses, 8)}
	l.gens[g.slot] = g.gen
	l.done.Store(tt.ended)
	m := &Manager{}
	m.down.Store(tt.down)
	if tt.noLink {
		l = nil
	}
	return m, peer, l
}

// check asserts err is tt's, for an op over route.
func (tt linkEndedCase) check(t *testing.T, route string, err error) {
	t.Helper()
	var gone *progress.PeerGoneError
	var ended *memLinkEnded
	switch {
	case tt.closed:
		require.ErrorIs(t, err, ErrClosed)
	case tt.wantGone:
		require.ErrorAs(t, err, &gone)
		require.Equal(t, route, gone.Provider, "%v", err)
	case tt.wantEnd:
		require.ErrorAs(t, err, &ended)
		require.False(t, errors.As(err, &gone), "a live owner reported gone: %v", err)
		require.True(t, Retryable(&TransferError{Op: "read", Ops: 1, Failed: 1, Errs: []error{err}}), "%v", err)
	default:
		require.NoError(t, err)
	}
}

// TestCMAAfterLinkEnded: a cma op whose link to the owner ended between
// its routing and its mark does not copy: the owner's Close, which counts
// this process's ops through that link, might not wait for it. It fails
// by why the link ended, moves nothing, and leaves no mark; with the link
// up, it copies and its mark ends with it.
func TestCMAAfterLinkEnded(t *testing.T) {
	const n = 8
	for _, tt := range linkEndedCases {
		t.Run(tt.name, func(t *testing.T) {
			local, err := mr.Alloc(4096)
			require.NoError(t, err)
			defer mr.Free(local)
			remote, err := mr.Alloc(4096)
			require.NoError(t, err)
			defer mr.Free(remote)
			copy(remote, "12345678")

			g := &guardRef{slot: 3, gen: 5}
			m, peer, l := tt.setup(t, g)
			ops := []opSpec{{op: progress.Read, kind: route.CMA,
				local:  view{st: &bufState{mem: local}, n: n},
				remote: RemoteBuffer{id: 1, size: n, n: n},
				ep:     &remoteEP{base: uint64(uintptr(unsafe.Pointer(&remote[0]))), guard: g},
				peer:   peer, link: l}}
			errs, failed := m.runCMA(route.Limit{Ctx: context.Background(), Start: time.Now(), Deadline: time.Now().Add(time.Minute)}, ops, nil)
			if l != nil {
				require.False(t, l.uses.InUse(g.slot), "the op left its mark")
			}
			if !tt.closed && !tt.wantGone && !tt.wantEnd {
				require.Empty(t, errs)
				require.Zero(t, failed)
				require.Equal(t, remote[:n], local[:n])
				return
			}
			require.Len(t, errs, 1)
			require.Equal(t, 1, failed)
			tt.check(t, cma.Name, errs[0])
			require.Equal(t, make([]byte, n), local[:n], "a copy moved bytes after its link ended")
		})
	}
}

// TestShmPartAfterLinkEnded: an shm part whose link to the owner ended
// before it was marked is not posted (markShmPart fails it), for the same
// reason as a cma op's, with the same errors, and leaves no mark. An
// owner gone is named as the shm route's other errors name it, by its shm
// address (until 2026-12-07 by its process, and test/TestOwnerKilled
// failed once in CI when the kill landed between two parts).
func TestShmPartAfterLinkEnded(t *testing.T) {
	for _, tt := range linkEndedCases {
		if tt.noLink || !tt.ended {
			continue // fill fails a part without a link before; an up link's mark is the Xfer's
		}
		t.Run(tt.name, func(t *testing.T) {
			g := &guardRef{slot: 3, gen: 5}
			m, peer, l := tt.setup(t, g)
			o := &opSpec{op: progress.Write, kind: route.Fabric, b: &libfabric.Route{Provider: fabric.BackendSHM},
				remote: RemoteBuffer{id: 1, size: 8, n: 8}, ep: &remoteEP{guard: g, name: []byte("the owner's shm name")}, peer: peer}
			err := m.markShmPart(nil, o, l) // an Xfer is needed only to hold a mark
			require.False(t, l.uses.InUse(g.slot), "the part left its mark")
			tt.check(t, string(fabric.BackendSHM), err)
			if tt.wantGone {
				require.Equal(t, o.b.Addr(o.ep.name), peerGoneOf(err).Peer, "the owner as the shm route names it")
			}
		})
	}
}
