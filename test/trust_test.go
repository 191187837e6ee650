package test

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// The attacks of a holder of one writable handle (docs/SECURITY.md): plant
// a fake guard entry in memory it may write, then hand over a handle whose
// guard table points at it and whose address points where nothing was
// registered for it — in this process (a confused deputy: the process acts
// on itself) or in the owner's. Each must fail, and the target memory
// must keep its bytes.

// TestNoConfusedDeputy: a handle whose guard table is a fake entry in a
// buffer of this process, and whose address is another buffer of this
// process that grants nothing, never makes this process write its own
// memory — whichever manager the handle names as owner.
func TestNoConfusedDeputy(t *testing.T) {
	const n = 4096
	for _, prov := range sameNodeProviders() {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(5*time.Second))
			peer := testpeer.Start(t, prov)
			foreign := peer.Register(n, mr.ReadWrite, 7)
			session, _ := register(t, m, n, mr.ReadWrite) // the attacker's own writable buffer here
			secret, secretMem := register(t, m, n, 0)     // granted to nobody
			testpeer.Fill(secretMem, 9)
			want := testpeer.Sum(secretMem)

			_, sessEPs := handleJSON(t, session.Remote())
			_, secEPs := handleJSON(t, secret.Remote())
			sessEP, secEP := endpointOf(sessEPs, prov), endpointOf(secEPs, prov)
			require.NotNil(t, sessEP, "the session buffer's %s endpoint", prov)
			g := sessEP["guard"].(map[string]any)
			const fakeID, fakeKey, fakeGen = 4242, 0x5eed, 3
			// Plant the entry with a legitimate write into the session buffer.
			entry := guardEntry(fakeGen, fakeKey, num(secEP["addr"]), n, mr.ReadWrite, fakeID, fakeKey, num(g["key"]))
			plant, plantMem := register(t, m, 64, 0)
			copy(plantMem, entry)
			sessHead, _ := session.Remote().Slice(0, 64)
			require.NoError(t, m.WriteFrom(context.Background(), sessHead, plant))

			owners := map[string]string{
				"owner another process": "", // the peer's real manager
				"owner unknown":         hex.EncodeToString(make([]byte, 16)),
				"owner this manager":    m.ID().String(),
			}
			for name, owner := range owners {
				t.Run(name, func(t *testing.T) {
					forged, err := alter(t, foreign, func(top map[string]any, eps []map[string]any) {
						if owner != "" {
							top["owner"] = owner
						}
						set(top, "id", fakeID)
						set(top, "size", n)
						set(top, "length", n)
						set(top, "offset", 0)
						e := endpointOf(eps, prov)
						e["name"] = sessEP["name"] // this process's endpoint: cma names the pid
						set(e, "key", fakeKey)
						set(e, "addr", num(secEP["addr"]))
						fg := e["guard"].(map[string]any)
						set(fg, "table", num(g["table"])) // the "table" is the planted entry
						set(fg, "key", num(g["key"]))
						set(fg, "slot", 0)
						set(fg, "gen", fakeGen)
					})
					require.NoError(t, err)
					// Point the table at the session buffer, where the entry is.
					forged, err = alter(t, forged, func(_ map[string]any, eps []map[string]any) {
						set(endpointOf(eps, prov)["guard"].(map[string]any), "table", num(sessEP["addr"]))
					})
					require.NoError(t, err)
					src, srcMem := register(t, m, n, 0)
					testpeer.Fill(srcMem, 11)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					err = m.WriteFrom(ctx, forged, src)
					t.Logf("write: %v", err)
					require.Error(t, err)
					assert.True(t, errorIsOneOf(err, transport.ErrStaleHandle, transport.ErrAccessDenied, transport.ErrNoRoute), "class of %v", err)
					assert.Equal(t, want, testpeer.Sum(secretMem), "this process's own memory was written")
					if rt, err := m.Route(forged); err == nil {
						assert.NotEqual(t, prov, rt.Backend, "a same-node route toward this process: %+v", rt)
					}
				})
			}
		})
	}
}

// TestPlantedGuardInOwner: the holder of a writable handle of an owner
// plants a fake entry in that buffer and points a handle's guard table at
// it, to reach another buffer of the owner that grants nothing.
func TestPlantedGuardInOwner(t *testing.T) {
	const n = 4096
	for _, prov := range sameNodeProviders() {
		t.Run(prov, func(t *testing.T) {
			testenv.RequireRoute(t, prov)
			m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(5*time.Second))
			owner := testpeer.Start(t, prov)
			writable := owner.Register(n, mr.ReadWrite, 1)
			owner.Register(n, 0, 2) // buffer 1: granted to nobody
			want := owner.Sum(1, 0, n)
			_, eps := handleJSON(t, writable)
			ep := endpointOf(eps, prov)
			g := ep["guard"].(map[string]any)
			const fakeID, fakeKey, fakeGen = 4243, 0x5eed, 5
			entry := guardEntry(fakeGen, fakeKey, owner.Addr(1), n, mr.ReadWrite, fakeID, fakeKey, num(g["key"]))
			plant, plantMem := register(t, m, 64, 0)
			copy(plantMem, entry)
			head, _ := writable.Slice(0, 64)
			require.NoError(t, m.WriteFrom(context.Background(), head, plant))

			forged, err := alter(t, writable, func(top map[string]any, eps []map[string]any) {
				set(top, "id", fakeID)
				e := endpointOf(eps, prov)
				set(e, "key", fakeKey)
				set(e, "addr", owner.Addr(1))
				fg := e["guard"].(map[string]any)
				set(fg, "table", num(e["addr"])-owner.Addr(1)+owner.Addr(0)) // the writable buffer
				set(fg, "slot", 0)
				set(fg, "gen", fakeGen)
			})
			require.NoError(t, err)
			src, srcMem := register(t, m, n, 0)
			testpeer.Fill(srcMem, 12)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			werr := m.WriteFrom(ctx, forged, src)
			t.Logf("write: %v", werr)
			require.ErrorIs(t, werr, transport.ErrStaleHandle)
			assert.Contains(t, werr.Error(), "guard table is not its owner's")
			assert.Equal(t, want, owner.Sum(1, 0, n), "the owner's ungranted buffer was written")
		})
	}
}

// TestOtherUserSameNode: an owner of another uid on this node gets no
// same-node route (the kernel would refuse process_vm_*, and its shm
// region is not this user's to map): its buffers go over tcp, and an owner
// that offers only shm is refused with a clear error.
func TestOtherUserSameNode(t *testing.T) {
	testenv.RequireRoot(t)
	const nobody = 65534
	owner := testpeer.StartAs(t, nobody, "shm", "tcp;ofi_rxm")
	h := owner.Register(1<<20, mr.ReadWrite, 3)
	m := newManager(t, transport.WithProviders("cma", "shm", "tcp;ofi_rxm"), transport.WithTimeout(5*time.Second))
	rt, err := m.Route(h)
	require.NoError(t, err)
	assert.Equal(t, "tcp;ofi_rxm", rt.Backend)
	assert.Contains(t, rt.Reason, "uid "+strconv.Itoa(nobody))
	local, mem := register(t, m, 1<<20, mr.ReadWrite)
	require.NoError(t, m.ReadInto(context.Background(), local, h))
	assert.Equal(t, owner.Sum(0, 0, 1<<20), testpeer.Sum(mem))

	shmOnly := testpeer.StartAs(t, nobody, "shm")
	hs := shmOnly.Register(4096, mr.ReadWrite, 4)
	ms := newManager(t, transport.WithProviders("shm"), transport.WithTimeout(5*time.Second))
	l4k, _ := register(t, ms, 4096, mr.ReadWrite)
	for i := 0; i < 2; i++ { // the second op once crashed inside libfabric
		err = ms.ReadInto(context.Background(), l4k, hs)
		require.ErrorIs(t, err, transport.ErrAccessDenied)
		assert.Contains(t, err.Error(), "runs as uid "+strconv.Itoa(nobody))
	}
}

// TestAddPeerIgnoresShmNames: a peer's word about its shm address never
// reaches libfabric: a name of a file in /dev/shm that is no shm region
// (any local user can make one) once crashed the process in fi_av_insert.
func TestAddPeerIgnoresShmNames(t *testing.T) {
	m := newManager(t, transport.WithProviders("shm"))
	name := strconv.Itoa(os.Getpid()+100000) + ":0:0"
	require.NoError(t, os.WriteFile("/dev/shm/"+name, []byte("not a region"), 0o600))
	t.Cleanup(func() { _ = os.Remove("/dev/shm/" + name) })
	done, err := m.AddPeer(transport.Address{Endpoints: []transport.AddressEndpoint{
		{Provider: "shm", Name: append([]byte("fi_shm://"+name), 0)},
	}})
	require.NoError(t, err)
	assert.Empty(t, done)
	// The manager still works.
	b, mem := register(t, m, 4096, mr.ReadWrite)
	testpeer.Fill(mem, 1)
	d, dmem := register(t, m, 4096, mr.ReadWrite)
	require.NoError(t, m.ReadInto(context.Background(), d, b.Remote()))
	assert.Equal(t, testpeer.Sum(mem), testpeer.Sum(dmem))
}

func errorIsOneOf(err error, targets ...error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// sameNodeProviders are the same-node routes.
func sameNodeProviders() []string { return []string{testenv.RouteCMA, testenv.RouteSHM} }

// TestRemoteRouteBesideShm: a manager with shm and tcp, as a default one
// has, moving bytes with an owner of this node that offers only tcp. The
// ops go over tcp, with no same-node owner behind them; they must not
// take the same-node paths (0c57b4e read that owner on every fabric op
// and panicked on 1.x, where shm copies itself; on 2.x that code did not
// get there).
func TestRemoteRouteBesideShm(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteSHM)
	testenv.RequireRoute(t, testenv.RouteTCP)
	const size = 1 << 20
	owner := testpeer.Start(t, testenv.RouteTCP)
	h := owner.Register(size, mr.ReadWrite, 5)
	m := newManager(t, transport.WithProviders(testenv.RouteSHM, testenv.RouteTCP))
	rt, err := m.Route(h)
	require.NoError(t, err)
	require.Equal(t, testenv.RouteTCP, rt.Backend, rt.Reason)
	b, mem := register(t, m, size, 0)
	require.NoError(t, m.ReadInto(context.Background(), b, h))
	require.Equal(t, testpeer.Sum(testpeer.Pattern(size, 5)), testpeer.Sum(mem), "read")
	testpeer.Fill(mem, 6)
	require.NoError(t, m.WriteFrom(context.Background(), h, b))
	require.Equal(t, testpeer.Sum(testpeer.Pattern(size, 6)), owner.Sum(0, 0, size), "write")
}
