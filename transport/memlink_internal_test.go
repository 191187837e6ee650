package transport

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
)

// TestReplacedMemLinkIsClosed: a link that a failed request ended is
// closed when memLink dials the one that replaces it: its buffer mappings
// are unmapped then, or, while an op still uses one, when that op ends —
// not kept for the process's life.
//
// The owner is a manager of this process, its link dialed as a verified
// peer's would be (verifyOwner refuses a manager of the same process;
// dialMem checks what the kernel says of the socket, which is this
// process then).
func TestReplacedMemLinkIsClosed(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	for _, tt := range []struct {
		name string
		inOp bool // an op holds the old link's mapping when the link is replaced
	}{
		{name: "no op uses the mapping"},
		{name: "an op uses the mapping until it ends", inOp: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			owner, err := New(context.Background(), WithProviders(mem.Name))
			require.NoError(t, err)
			t.Cleanup(func() { _ = owner.Close() })
			const size = 4096
			b, err := mr.Alloc(size)
			require.NoError(t, err)
			t.Cleanup(func() { _ = mr.Free(b) })
			copy(b, "the owner's buffer")
			buf, err := owner.Register(b, mr.ReadWrite)
			require.NoError(t, err)
			t.Cleanup(func() { _ = buf.Close() })
			h := buf.Remote()
			ep := h.endpoint(mem.Name)
			require.NotNil(t, ep, "the handle offers the mem route")
			require.NotNil(t, ep.guard)

			p := &sameNodePeer{owner: owner.id}
			pid, err := parseProof(owner.proof(), p)
			require.NoError(t, err)
			require.Equal(t, os.Getpid(), pid)
			p.pid = pid
			t.Cleanup(p.closeMem)

			old, err := p.memLink(testTimes())
			require.NoError(t, err)
			mm, err := old.get(testTimes(), &h, ep) // the op's reference and the link's
			require.NoError(t, err)
			require.Equal(t, "the owner's buffer", string(mm.b[:18]))
			file := mappedFile(t, mm.b)
			require.Equal(t, 2, mappings(t, file), "the owner's allocation and the link's mapping")
			if !tt.inOp {
				mm.unref() // the op ends: the link's reference is left
			}
			refs := int32(1) // the link's
			if tt.inOp {
				refs++
			}
			require.Equal(t, refs, mm.refs.Load())

			// A request that fails on the link ends it, as ask does on any
			// failure but a refusal: here the connection is gone under it.
			require.NoError(t, old.conn.Close())
			old.mu.Lock()
			_, _, err = old.ask(nil, []byte(memCtlReq), nil, 2)
			old.mu.Unlock()
			require.Error(t, err)
			require.True(t, old.done.Load(), "a failed request ends the link")

			l, err := p.memLink(testTimes())
			require.NoError(t, err)
			require.NotSame(t, old, l, "an ended link is replaced")
			require.False(t, l.done.Load())

			old.mu.Lock()
			kept := len(old.maps)
			old.mu.Unlock()
			require.Zero(t, kept, "the replaced link still holds its mappings")
			if tt.inOp {
				require.Equal(t, int32(1), mm.refs.Load(), "the op's mapping went while the op used it")
				require.Equal(t, 2, mappings(t, file), "the op's mapping went while the op used it")
				mm.unref() // the op ends
			}
			require.Zero(t, mm.refs.Load(), "the replaced link's mapping is still referenced")
			require.Equal(t, 1, mappings(t, file), "the replaced link's mapping is still mapped")

			// The new link maps the buffer again.
			mm2, err := l.get(testTimes(), &h, ep)
			require.NoError(t, err)
			require.Equal(t, "the owner's buffer", string(mm2.b[:18]))
			mm2.unref()
		})
	}
}

// mappedFile is the device and inode, as /proc/self/maps shows them, of
// the file mapped at b.
func mappedFile(t *testing.T, b []byte) string {
	t.Helper()
	start := fmt.Sprintf("%x-", mr.Addr(b))
	var file string
	eachMapping(t, func(f []string) {
		if strings.HasPrefix(f[0], start) {
			file = f[3] + " " + f[4]
		}
	})
	require.NotEmpty(t, file, "nothing is mapped at %#x", mr.Addr(b))
	return file
}

// mappings counts this process's mappings of file (mappedFile).
func mappings(t *testing.T, file string) int {
	t.Helper()
	n := 0
	eachMapping(t, func(f []string) {
		if f[3]+" "+f[4] == file {
			n++
		}
	})
	return n
}

// eachMapping calls fn with the fields of each line of /proc/self/maps.
func eachMapping(t *testing.T, fn func(fields []string)) {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Fields(s.Text()); len(fields) >= 5 {
			fn(fields)
		}
	}
	require.NoError(t, s.Err())
}
