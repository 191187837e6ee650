package transport_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// TestShmHandleCheck: on shm and cma, every op checks its buffer's guard
// entry at the owner — read directly with process_vm_readv (cma, and shm
// where shm would copy that way itself), or over shm — or, once read,
// against the owner's published generation of its slot (entryCache), so a
// buffer the owner closed, and a handle of the registration that an
// entry's slot served before, fail with ErrStaleHandle before anything
// moves, after ops that succeeded on it, and the new handle works.
func TestShmHandleCheck(t *testing.T) {
	const n = 4096
	for _, mode := range []string{"direct", "over shm", "cma"} {
		t.Run(mode, func(t *testing.T) {
			route := testenv.RouteSHM
			if mode == "cma" {
				route = testenv.RouteCMA
			}
			testenv.RequireRoute(t, route)
			testenv.RequireRoute(t, testenv.RouteMem) // mem allowed: the generations pages the kept entries rely on
			m := newManager(t, transport.WithProviders(route))
			switch ok, _ := transport.CMAAvailable(); {
			case mode == "over shm":
				transport.GuardOverShm(m)
			case mode == "cma":
			case ok && fabric.RuntimeVersion().Major() == 1 && !fabric.EnvTruthy("FI_SHM_DISABLE_CMA"):
				require.True(t, transport.GuardDirect(m), "shm copies with process_vm_readv here: its handle checks must too")
			default:
				require.False(t, transport.GuardDirect(m))
				t.Log("shm does not copy with process_vm_readv here: both modes read over shm")
			}
			owner := testpeer.Start(t, route)
			h := owner.Register(n, mr.ReadWrite, 1)
			mem := alloc(t, n)
			local := register(t, m, mem, 0)
			ctx := ctxTimeout(t, time.Minute)
			require.NoError(t, m.ReadInto(ctx, local, h))
			require.Equal(t, testpeer.Pattern(n, 1), mem)
			// The link that keeps entries (read with process_vm_readv
			// or over shm) comes up in the background after the first
			// op; the next op's read keeps the entry, and the ops
			// after it read nothing.
			require.Eventually(t, func() bool { return transport.EntriesKept(m, h) }, 10*time.Second, time.Millisecond)
			require.NoError(t, m.ReadInto(ctx, local, h))
			require.Equal(t, testpeer.Pattern(n, 1), mem)
			require.True(t, transport.EntryKept(m, h), "the entry read is kept")
			require.NoError(t, m.WriteFrom(ctx, h, local))

			owner.CloseBuf(0)
			want := owner.Sum(0, 0, n)
			testpeer.Fill(mem, 9)
			assert.ErrorIs(t, m.WriteFrom(ctx, h, local), transport.ErrStaleHandle)
			assert.Equal(t, want, owner.Sum(0, 0, n), "a closed buffer was written")
			assert.ErrorIs(t, m.ReadInto(ctx, local, h), transport.ErrStaleHandle)
			assert.Equal(t, testpeer.Pattern(n, 9), mem, "a closed buffer was read")

			// The next registration takes the freed slot, with a new
			// generation: the old handle names the slot and stays stale.
			h2 := owner.Register(n, mr.ReadWrite, 2)
			require.Equal(t, guardOf(t, h, route).Slot, guardOf(t, h2, route).Slot, "the slot is reused")
			require.NotEqual(t, guardOf(t, h, route).Gen, guardOf(t, h2, route).Gen)
			assert.ErrorIs(t, m.ReadInto(ctx, local, h), transport.ErrStaleHandle)
			assert.ErrorIs(t, m.WriteFrom(ctx, h, local), transport.ErrStaleHandle)
			assert.Equal(t, testpeer.Pattern(n, 9), mem)
			require.NoError(t, m.ReadInto(ctx, local, h2))
			assert.Equal(t, testpeer.Pattern(n, 2), mem)

			// An action with ops on both: refused whole, before anything moves.
			testpeer.Fill(mem, 10)
			a := m.NewAction().AllowOverlap().ReadInto(local, h2).ReadInto(local, h)
			assert.ErrorIs(t, a.Submit(ctx), transport.ErrStaleHandle)
			assert.Equal(t, testpeer.Pattern(n, 10), mem)
		})
	}
}

// guard is a handle's shm guard, from its JSON form.
type guard struct {
	Slot uint32 `json:"slot"`
	Gen  string `json:"gen"`
}

func guardOf(t *testing.T, h transport.RemoteBuffer, route string) guard {
	t.Helper()
	b, err := json.Marshal(h)
	require.NoError(t, err)
	var v struct {
		Endpoints []struct {
			Provider string `json:"provider"`
			Guard    *guard `json:"guard"`
		} `json:"endpoints"`
	}
	require.NoError(t, json.Unmarshal(b, &v))
	for _, ep := range v.Endpoints {
		if ep.Provider == route && ep.Guard != nil {
			return *ep.Guard
		}
	}
	t.Fatalf("no %s guard in %s", route, b)
	return guard{}
}
