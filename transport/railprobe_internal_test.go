package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// TestRailProbeNeedsARailOp: a probe of a dead rail brings it back only
// when its read went over that rail. A read another route carries (here
// a copy between managers of this process, which the rails never see)
// leaves the rail down however well it went, and so does a request whose
// first op is such a copy and whose op over the rails gives nothing to
// probe with (a handle peers may not read). A probe that reads over the
// rail, by itself or for a request whose first op is a copy, brings the
// rail back.
//
// The rail is the manager's tcp endpoint on loopback. The owner whose
// buffers are read over it is another manager of this process, taken out
// of liveManagers while the test runs, so that its handles are routed as
// those of another process with no same-node route in common: over the
// rail.
func TestRailProbeNeedsARailOp(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	const n = 8 << 10
	open := func() *Manager {
		m, err := New(context.Background(), WithProviders(testenv.RouteTCP))
		require.NoError(t, err)
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	register := func(m *Manager, access mr.Access) *Buffer {
		b, err := mr.Alloc(n)
		require.NoError(t, err)
		t.Cleanup(func() { _ = mr.Free(b) })
		buf, err := m.Register(b, access)
		require.NoError(t, err)
		t.Cleanup(func() { _ = buf.Close() })
		return buf
	}
	m, sibling, far := open(), open(), open()
	require.Len(t, m.backends().rails, 1)
	own := register(m, mr.ReadWrite).Remote()         // a copy within m
	other := register(sibling, mr.ReadWrite).Remote() // a copy from another manager of this process
	overRail := register(far, mr.ReadWrite).Remote()
	writeOnly := register(far, mr.RemoteWrite).Remote() // over the rail, and no probe reads it
	// far as if it were in another process (back before it closes).
	_, was := liveManagers.LoadAndDelete(far.id)
	require.True(t, was)
	liveCount.Add(-1)
	t.Cleanup(func() {
		liveCount.Add(1)
		liveManagers.Store(far.id, far)
	})
	for _, tc := range []struct {
		h    RemoteBuffer
		kind route.Kind
	}{{own, route.Memcpy}, {other, route.Memcpy}, {overRail, route.Fabric}, {writeOnly, route.Fabric}} {
		rt, err := m.route(&tc.h, 1, testTimes())
		require.NoError(t, err)
		require.Equal(t, tc.kind, rt.kind, "the route of the handle of buffer %d", tc.h.id)
	}

	health := m.health(0)
	idle := func() bool { return !health.probing.Load() }
	t.Cleanup(func() { // no probe outlives the test
		require.Eventually(t, idle, 10*time.Second, time.Millisecond)
	})
	local := register(m, 0)
	op := func(op progress.Op, h RemoteBuffer) opSpec {
		return opSpec{op: op, local: view{local.st, 0, h.n}, remote: h}
	}
	for _, tt := range []struct {
		name   string
		ops    []opSpec // a request run over the rails; nil: probeRail(0, with) alone
		with   RemoteBuffer
		probed bool // a probe ran
		up     bool // and brought the rail back
	}{
		{name: "probed with a handle of its own manager", with: own, probed: true},
		{name: "probed with a handle of another manager of this process", with: other, probed: true},
		{name: "probed with a handle over the rail", with: overRail, probed: true, up: true},
		{name: "a request whose first op is a copy and whose op over the rails probes nothing",
			ops: []opSpec{op(progress.Read, own), op(progress.Write, writeOnly)}},
		{name: "a request whose first op is a copy and whose op over the rails probes",
			ops: []opSpec{op(progress.Read, other), op(progress.Read, overRail)}, probed: true, up: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			health.down.Store(true)
			health.probedAt.Store(0) // due for a probe
			if tt.ops == nil {
				m.probeRail(0, tt.with)
			} else {
				require.ErrorIs(t, m.runRails(context.Background(), "request", tt.ops), ErrNoRail)
			}
			require.Eventually(t, idle, 10*time.Second, time.Millisecond, "the probe did not end")
			if tt.up {
				require.False(t, health.down.Load(), "a probe that read over the rail left it down")
			} else {
				require.True(t, health.down.Load(), "a probe that read over no rail brought the rail back")
			}
			require.Equal(t, tt.probed, health.probedAt.Load() != 0, "a probe ran")
		})
	}
}
