package transport

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/topology"
	"github.com/fitransfer/fitransfer/internal/topology/topotest"
	"github.com/fitransfer/fitransfer/mr"
)

// p4dRails is a manager with the four EFA rails of a p4d.24xlarge, on the
// recorded topology of internal/topology/testdata (no endpoints opened:
// only the rail choice is under test).
func p4dRails(t *testing.T) *Manager {
	m := &Manager{topo: topology.Tree{Root: topotest.LayOut(t, filepath.Join("..", "internal", "topology", "testdata", "p4d.24xlarge.sysfs"))}}
	bs := &backendSet{}
	for i, bus := range []uint8{0x10, 0x20, 0x90, 0xa0} {
		in := fabric.Info{NIC: &fabric.NIC{Bus: &fabric.BusAttr{Type: 1, PCI: &fabric.PCIAttr{BusID: bus, DeviceID: 0x1b}}}}
		in.Fabric.ProvName = "efa"
		bs.rails = append(bs.rails, &libfabric.Route{Provider: fabric.BackendEFA, Info: in, Rail: i})
	}
	bs.remote = bs.rails[0]
	m.set.Store(bs)
	return m
}

// TestRailAffinity: an op that is not striped takes a rail nearest its
// memory — the GPU's switch's NIC, the host node's NICs — spread by owner
// among equally near ones, and another rail while those are down.
func TestRailAffinity(t *testing.T) {
	m := p4dRails(t)
	host, err := mr.Alloc(4096)
	require.NoError(t, err)
	defer mr.Free(host)
	host[0] = 1 // resident: its node is known
	node, err := topology.HostNode(host)
	require.NoError(t, err)
	require.Equal(t, 0, node, "this machine's memory is on node 0")

	owners := func(near []int) map[int]bool {
		seen := map[int]bool{}
		for o := byte(0); o < 64; o++ {
			seen[m.pickRail(&RemoteBuffer{owner: ID{o, o * 7, 3, 1, 9, 2, o, 5}}, near)] = true
		}
		return seen
	}
	for _, tc := range []struct {
		name string
		st   *bufState
		near []int
	}{
		{"GPU 0000:90:1c.0: the NIC of its switch", &bufState{iface: mr.CUDA, devicePCI: "0000:90:1c.0"}, []int{2}},
		{"GPU 0000:20:1d.0", &bufState{iface: mr.CUDA, devicePCI: "0000:20:1d.0"}, []int{1}},
		{"host memory on node 0: the node's two NICs", &bufState{iface: mr.Host, mem: host}, []int{0, 1}},
		{"GPU without a PCI address: every rail", &bufState{iface: mr.CUDA}, nil},
		{"GPU address that does not parse: every rail", &bufState{iface: mr.CUDA, devicePCI: "10:1c"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near := m.nearRails(tc.st)
			assert.Equal(t, tc.near, near)
			want := map[int]bool{0: true, 1: true, 2: true, 3: true}
			if near != nil {
				want = map[int]bool{}
				for _, r := range near {
					want[r] = true
				}
			}
			assert.Equal(t, want, owners(near), "owners spread over the nearest rails, and only those")
		})
	}
	t.Run("nearest rails down: the others", func(t *testing.T) {
		m.health(0).down.Store(true)
		m.health(1).down.Store(true)
		defer m.health(0).down.Store(false)
		defer m.health(1).down.Store(false)
		assert.Equal(t, map[int]bool{2: true, 3: true}, owners([]int{0, 1}))
	})
	t.Run("no PCI addresses (tcp): every rail", func(t *testing.T) {
		m := p4dRails(t)
		m.backends().rails[3].Info.NIC = nil
		assert.Nil(t, m.nearRails(&bufState{iface: mr.Host, mem: host}))
	})
}

// TestSplit: a striped op's pieces cover it exactly, start on 64 KiB
// multiples, and give each rail up a share in proportion to its link
// speed, less what it already has queued; below 1 MiB, one piece.
func TestSplit(t *testing.T) {
	const gbit = 1e9
	for _, tc := range []struct {
		name   string
		speeds []uint64 // per rail; 0: unknown
		queued []int64
		down   []int
		n      uint64
		want   []uint64 // bytes per rail
	}{
		{"equal rails", []uint64{100 * gbit, 100 * gbit, 100 * gbit, 100 * gbit}, nil, nil, 64 << 20, []uint64{16 << 20, 16 << 20, 16 << 20, 16 << 20}},
		{"speeds unknown: equal", []uint64{0, 0, 0, 0}, nil, nil, 64 << 20, []uint64{16 << 20, 16 << 20, 16 << 20, 16 << 20}},
		{"one rail twice as fast", []uint64{200 * gbit, 100 * gbit, 100 * gbit, 100 * gbit}, nil, nil, 50 << 20, []uint64{20 << 20, 10 << 20, 10 << 20, 10 << 20}},
		{"a rail with a queue gets less", []uint64{0, 0, 0, 0}, []int64{8 << 20, 0, 0, 0}, nil, 56 << 20, []uint64{8 << 20, 16 << 20, 16 << 20, 16 << 20}},
		{"a rail queued past its share gets none", []uint64{0, 0, 0, 0}, []int64{24 << 20, 0, 0, 0}, nil, 39 << 20, []uint64{0, 13 << 20, 13 << 20, 13 << 20}},
		{"a rail down gets none", []uint64{0, 0, 0, 0}, nil, []int{1}, 48 << 20, []uint64{16 << 20, 0, 16 << 20, 16 << 20}},
		{"odd size: the last rail takes the rest", []uint64{0, 0, 0, 0}, nil, nil, 4<<20 + 3, []uint64{1 << 20, 1 << 20, 1 << 20, 1<<20 + 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := p4dRails(t)
			for i, b := range m.backends().rails {
				b.Info.NIC.Link = &fabric.LinkAttr{Speed: tc.speeds[i]}
				if tc.queued != nil {
					m.health(i).queued.Store(tc.queued[i])
				}
			}
			for _, r := range tc.down {
				m.health(r).down.Store(true)
				m.health(r).probedAt.Store(time.Now().UnixNano()) // not due for a probe
			}
			o := &opSpec{remote: RemoteBuffer{n: tc.n, access: mr.RemoteWrite}}
			pieces := m.split(nil, 0, o, 0, tc.n)
			got := make([]uint64, 4)
			at := uint64(0)
			for _, p := range pieces {
				assert.Equal(t, at, p.off, "pieces are contiguous")
				assert.Zero(t, p.off%stripeAlign, "piece at %d", p.off)
				got[p.rail] += p.n
				at += p.n
			}
			assert.Equal(t, tc.n, at, "pieces cover the op")
			assert.Equal(t, tc.want, got)
		})
	}
	t.Run("below 1 MiB: one piece", func(t *testing.T) {
		m := p4dRails(t)
		o := &opSpec{remote: RemoteBuffer{n: stripeMin - 1}, local: view{st: &bufState{}}}
		pieces := m.split(nil, 0, o, 0, stripeMin-1)
		require.Len(t, pieces, 1)
		assert.Equal(t, uint64(stripeMin-1), pieces[0].n)
	})
}

// TestRailInfos: named rails in the order named; a domain named twice or
// missing is refused, naming what is there; "all" leaves tcp's loopback
// out; without names, tcp opens its first domain alone.
func TestRailInfos(t *testing.T) {
	var infos []fabric.Info
	for _, d := range []string{"lo", "eth0", "eth1"} {
		in := fabric.Info{Caps: fabric.RMACaps}
		in.EP.Type = fabric.EPRDM
		in.Fabric.ProvName = "tcp;ofi_rxm"
		in.Domain.Name = d
		infos = append(infos, in)
	}
	names := func(l []*fabric.Info) []string {
		var out []string
		for _, in := range l {
			out = append(out, in.Domain.Name)
		}
		return out
	}
	got, err := RailInfos(infos, &infos[0], []string{"eth1", " eth0"}, "WithRails")
	require.NoError(t, err)
	assert.Equal(t, []string{"eth1", "eth0"}, names(got))
	got, err = RailInfos(infos, &infos[0], []string{"all"}, "WithRails")
	require.NoError(t, err)
	assert.Equal(t, []string{"eth0", "eth1"}, names(got))
	got, err = RailInfos(infos, &infos[1], nil, "")
	require.NoError(t, err)
	assert.Equal(t, []string{"eth0"}, names(got))
	_, err = RailInfos(infos, &infos[0], []string{"eth0", "eth0"}, "WithRails")
	assert.ErrorContains(t, err, `WithRails names domain "eth0" twice`)
	_, err = RailInfos(infos, &infos[0], []string{"eth9"}, "FITRANSFER_RAILS")
	assert.ErrorContains(t, err, `FITRANSFER_RAILS: tcp;ofi_rxm has no domain "eth9" here (its domains: lo, eth0, eth1)`)
}
