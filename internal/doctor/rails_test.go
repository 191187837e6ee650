package doctor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/topology"
	"github.com/fitransfer/fitransfer/internal/topology/topotest"
	"github.com/fitransfer/fitransfer/transport"
)

// fiInfo reads a recorded fi_info output of fabric's testdata (each file
// names its source).
func fiInfo(t *testing.T, name string) []fabric.Info {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "fabric", "testdata", "fi_info", name))
	require.NoError(t, err)
	infos, err := fabric.ParseFiInfoText(string(b))
	require.NoError(t, err, name)
	return infos
}

// sysfs lays out the topology fixture of a node (internal/topology/testdata).
func sysfs(t *testing.T, node string) string {
	return topotest.LayOut(t, filepath.Join("..", "topology", "testdata", node+".sysfs"))
}

// local are shm and tcp;ofi_rxm as libfabric 2.1 reports them on this
// project's machine; neither has a NIC.
func local(t *testing.T) []fabric.Info {
	return append(fiInfo(t, "local_shm_rdm_v_2.1.txt"), fiInfo(t, "local_tcp_ofi_rxm_rdm_v_2.1.txt")...)
}

// withNIC is in as the efa info of domain rdmap<bus>s<dev>-rdm, with the
// PCI address that name stands for: EFA devices are named rdmap<bus>s<slot>
// in decimal, which the recorded p5 output shows next to its fi_pci_attr
// (rdmap79s0 at bus_id 79, device_id 0, function_id 0). The bus type is
// the recorded p5 NIC's (FI_BUS_PCI).
func withNIC(t *testing.T, in fabric.Info, bus, dev uint8) fabric.Info {
	name := fmt.Sprintf("rdmap%ds%d", bus, dev)
	in.Domain.Name = name + "-rdm"
	in.NIC = &fabric.NIC{
		Device: &fabric.DeviceAttr{Name: name},
		Bus:    &fabric.BusAttr{Type: fiInfo(t, "p5.48xlarge_efa_v_2.0.txt")[0].NIC.Bus.Type, PCI: &fabric.PCIAttr{BusID: bus, DeviceID: dev}},
	}
	return in
}

// p4dEFA: the efa infos of a p4d.24xlarge. The recorded output
// (p4d.24xlarge_efa_rdm_1.22.txt) is fi_info's short form, cut by its
// author after two of the four domains, so it carries neither caps nor
// NICs. Completed here as fabric's select tests and topology's README do:
// the efa RDM info has the same caps on every device (taken from the p5
// output); the two domains cut, rdmap144s27-rdm and rdmap160s27-rdm, are
// the NICs at buses 0x90 and 0xa0 of aws-ofi-nccl's p4d topology; each
// NIC's PCI address is the one its name stands for (withNIC).
func p4dEFA(t *testing.T) []fabric.Info {
	rec := fiInfo(t, "p4d.24xlarge_efa_rdm_1.22.txt")
	require.Len(t, rec, 2)
	caps := fiInfo(t, "p5.48xlarge_efa_v_2.0.txt")[0].Caps
	var out []fabric.Info
	for i, bus := range []uint8{0x10, 0x20, 0x90, 0xa0} {
		in := withNIC(t, rec[min(i, 1)], bus, 0x1b)
		if i < 2 {
			require.Equal(t, rec[i].Domain.Name, in.Domain.Name, "the recorded domain names this NIC")
		}
		in.Caps = caps
		out = append(out, in)
	}
	return out
}

// p4dFacts: what fi_getopt answers on p4d's devices (RDMA read on the
// device, write emulated), as in fabric's select tests.
func p4dFacts() fabric.Facts {
	f := fabric.Facts{DeviceRMA: map[string]fabric.DeviceRMA{}}
	for _, d := range []string{"rdmap16s27-rdm", "rdmap32s27-rdm", "rdmap144s27-rdm", "rdmap160s27-rdm"} {
		f.DeviceRMA[d] = fabric.DeviceRMA{Read: fabric.Yes, Write: fabric.No}
	}
	return f
}

func pci(t *testing.T, s string) topology.PCIAddr {
	a, err := topology.ParsePCIAddr(s)
	require.NoError(t, err)
	return a
}

// nearest is the mapping as "location: rails".
func nearest(r *Rails) map[string][]int {
	m := map[string][]int{}
	for _, mr := range r.Memory {
		m[mr.location().String()] = mr.Rails
	}
	return m
}

func TestRailsP4d(t *testing.T) {
	t.Setenv(transport.RailsEnv, "")
	root := sysfs(t, "p4d.24xlarge")
	infos := append(p4dEFA(t), local(t)...)

	t.Run("efa with emulated writes allowed: every NIC", func(t *testing.T) {
		r := railsFor(infos, fabric.AllowEmulatedRMA, p4dFacts(), root)
		require.Empty(t, r.Err)
		assert.Equal(t, "efa", r.Provider)
		assert.Empty(t, r.Note)
		require.Len(t, r.Rails, 4)
		for i, want := range []struct {
			domain, pci, name, sw string
			node                  int
		}{
			{"rdmap16s27-rdm", "0000:10:1b.0", "rdmap16s27", "0000:0f:00.0", 0},
			{"rdmap32s27-rdm", "0000:20:1b.0", "rdmap32s27", "0000:1f:00.0", 0},
			{"rdmap144s27-rdm", "0000:90:1b.0", "rdmap144s27", "0000:8f:00.0", 1},
			{"rdmap160s27-rdm", "0000:a0:1b.0", "rdmap160s27", "0000:9f:00.0", 1},
		} {
			rl := r.Rails[i]
			assert.Equal(t, i, rl.Rail)
			assert.Equal(t, want.domain, rl.Domain)
			require.NotNil(t, rl.NIC, want.domain)
			assert.Equal(t, want.pci, rl.NIC.Addr.String())
			assert.Equal(t, want.name, rl.NIC.Name, "sysfs names the device fi_info's domain is on")
			assert.Equal(t, want.node, rl.NIC.NUMANode)
			require.NotNil(t, rl.NIC.Switch)
			assert.Equal(t, want.sw, rl.NIC.Switch.String())
			assert.Len(t, rl.NIC.Accelerators, 2)
			assert.Empty(t, rl.NIC.Err)
		}
		assert.Equal(t, map[string][]int{
			"device 0000:10:1c.0": {0}, "device 0000:10:1d.0": {0},
			"device 0000:20:1c.0": {1}, "device 0000:20:1d.0": {1},
			"device 0000:90:1c.0": {2}, "device 0000:90:1d.0": {2},
			"device 0000:a0:1c.0": {3}, "device 0000:a0:1d.0": {3},
			"host node 0": {0, 1}, "host node 1": {2, 3},
		}, nearest(r))
		assert.Equal(t, Check{Name: "rails", Status: Pass, Detail: "4 of efa (every domain: the default for efa)"}, r.check())

		var text bytes.Buffer
		require.NoError(t, r.WriteText(&text))
		assert.Equal(t, `rails: 4 of efa (every domain: the default for efa)
  rail 0  rdmap16s27-rdm   0000:10:1b.0 rdmap16s27 numa 0 switch 0000:0f:00.0 with 0000:10:1c.0 0000:10:1d.0
  rail 1  rdmap32s27-rdm   0000:20:1b.0 rdmap32s27 numa 0 switch 0000:1f:00.0 with 0000:20:1c.0 0000:20:1d.0
  rail 2  rdmap144s27-rdm  0000:90:1b.0 rdmap144s27 numa 1 switch 0000:8f:00.0 with 0000:90:1c.0 0000:90:1d.0
  rail 3  rdmap160s27-rdm  0000:a0:1b.0 rdmap160s27 numa 1 switch 0000:9f:00.0 with 0000:a0:1c.0 0000:a0:1d.0
memory → NIC: the rails nearest the memory of each accelerator and NUMA node
  device 0000:10:1c.0  rail 0 (rdmap16s27)
  device 0000:10:1d.0  rail 0 (rdmap16s27)
  device 0000:20:1c.0  rail 1 (rdmap32s27)
  device 0000:20:1d.0  rail 1 (rdmap32s27)
  device 0000:90:1c.0  rail 2 (rdmap144s27)
  device 0000:90:1d.0  rail 2 (rdmap144s27)
  device 0000:a0:1c.0  rail 3 (rdmap160s27)
  device 0000:a0:1d.0  rail 3 (rdmap160s27)
  host node 0          rails 0 1 (rdmap16s27 rdmap32s27)
  host node 1          rails 2 3 (rdmap144s27 rdmap160s27)
`, text.String())

		b, err := json.Marshal(r)
		require.NoError(t, err)
		var back struct {
			Rails []struct {
				Domain string
				NIC    struct {
					PCI      string `json:"pci"`
					NUMANode int    `json:"numa_node"`
				} `json:"nic"`
			} `json:"rails"`
			Memory []struct {
				Device   string `json:"device"`
				NUMANode *int   `json:"numa_node"`
				Rails    []int  `json:"rails"`
			} `json:"memory"`
		}
		require.NoError(t, json.Unmarshal(b, &back))
		require.Len(t, back.Rails, 4)
		assert.Equal(t, "0000:90:1b.0", back.Rails[2].NIC.PCI)
		assert.Equal(t, 1, back.Rails[2].NIC.NUMANode)
		require.Len(t, back.Memory, 10)
		assert.Equal(t, "0000:10:1c.0", back.Memory[0].Device)
		assert.Nil(t, back.Memory[0].NUMANode)
		assert.Equal(t, []int{0}, back.Memory[0].Rails)
		require.NotNil(t, back.Memory[8].NUMANode)
		assert.Equal(t, 0, *back.Memory[8].NUMANode, "node 0 is in the JSON, not left out as empty")
	})

	t.Run("by default tcp: one rail, no PCI address", func(t *testing.T) {
		r := railsFor(infos, fabric.RequireDeviceRMA, p4dFacts(), root)
		assert.Equal(t, string(fabric.BackendTCP), r.Provider)
		assert.Equal(t, []Rail{{Rail: 0, Domain: "eth0"}}, r.Rails)
		assert.Empty(t, r.Memory)
		var text bytes.Buffer
		require.NoError(t, r.WriteText(&text))
		assert.Equal(t, `rails: 1 of tcp;ofi_rxm (one domain: tcp;ofi_rxm opens more only where FITRANSFER_RAILS or WithRails names them)
  rail 0  eth0  no PCI address from fi_info
  fi_info gives no PCI address for the domains of tcp;ofi_rxm: no NIC to place, no memory → NIC mapping
`, text.String())
		assert.Equal(t, Pass, r.check().Status)
	})

	t.Run("FITRANSFER_RAILS names two, in its order", func(t *testing.T) {
		t.Setenv(transport.RailsEnv, "rdmap144s27-rdm, rdmap16s27-rdm")
		r := railsFor(infos, fabric.AllowEmulatedRMA, p4dFacts(), root)
		require.Empty(t, r.Err)
		assert.Equal(t, "named by "+transport.RailsEnv, r.Rule)
		require.Len(t, r.Rails, 2)
		assert.Equal(t, "0000:90:1b.0", r.Rails[0].NIC.Addr.String())
		assert.Equal(t, "0000:10:1b.0", r.Rails[1].NIC.Addr.String())
		m := nearest(r)
		assert.Equal(t, []int{1}, m["device 0000:10:1c.0"])
		assert.Equal(t, []int{1}, m["device 0000:20:1c.0"], "no rail behind its switch: the one on its node")
		assert.Equal(t, []int{0}, m["host node 1"])
	})

	t.Run("FITRANSFER_RAILS names a domain not here", func(t *testing.T) {
		t.Setenv(transport.RailsEnv, "rdmap99s0-rdm")
		r := railsFor(infos, fabric.AllowEmulatedRMA, p4dFacts(), root)
		assert.Contains(t, r.Err, `has no domain "rdmap99s0-rdm"`)
		assert.Empty(t, r.Rails)
		c := r.check()
		assert.Equal(t, Fail, c.Status)
		assert.Contains(t, c.Fix, "fitransfer info -p efa")
	})

	t.Run("no sysfs: rails without a place", func(t *testing.T) {
		r := railsFor(infos, fabric.AllowEmulatedRMA, p4dFacts(), t.TempDir())
		require.Len(t, r.Rails, 4)
		for _, rl := range r.Rails {
			require.NotNil(t, rl.NIC)
			assert.Equal(t, -1, rl.NIC.NUMANode)
			assert.NotEmpty(t, rl.NIC.Err)
		}
		assert.Empty(t, r.Memory)
	})
}

// p5EFA: the recorded p5 output holds the efa info of its first NIC
// only, rdmap79s0 at 0000:4f:00.0; the other 31 are that info on the NICs
// of aws-ofi-nccl's p5 topology (internal/topology/testdata/README.md).
func p5EFA(t *testing.T) []fabric.Info {
	rec := fiInfo(t, "p5.48xlarge_efa_v_2.0.txt")
	require.Len(t, rec, 1)
	var out []fabric.Info
	for _, group := range [][2]uint8{{0x4f, 0x52}, {0x60, 0x63}, {0x71, 0x74}, {0x82, 0x85}, {0x93, 0x96}, {0xa4, 0xa7}, {0xb5, 0xb8}, {0xc6, 0xc9}} {
		for bus := group[0]; bus <= group[1]; bus++ {
			in := withNIC(t, rec[0], bus, 0)
			in.NIC.Link = rec[0].NIC.Link
			out = append(out, in)
		}
	}
	return out
}

func TestRailsP5(t *testing.T) {
	t.Setenv(transport.RailsEnv, "")
	root := sysfs(t, "p5.48xlarge")
	facts := fabric.Facts{DeviceRMA: map[string]fabric.DeviceRMA{}}
	for _, in := range p5EFA(t) {
		facts.DeviceRMA[in.Domain.Name] = fabric.DeviceRMA{Read: fabric.Yes, Write: fabric.Yes}
	}

	t.Run("the recorded NIC is where the sysfs fixture has it", func(t *testing.T) {
		rec := fiInfo(t, "p5.48xlarge_efa_v_2.0.txt")
		r := railsOf(rec, &rec[0], "efa", root)
		require.Len(t, r.Rails, 1)
		nic := r.Rails[0].NIC
		require.NotNil(t, nic)
		assert.Equal(t, "0000:4f:00.0", nic.Addr.String())
		assert.Equal(t, rec[0].NIC.Device.Name, nic.Name, "fi_info's device name is sysfs's name of that PCI address")
		assert.Equal(t, "rdmap79s0-rdm", r.Rails[0].Domain)
		assert.Equal(t, 0, nic.NUMANode)
		assert.Equal(t, []topology.PCIAddr{pci(t, "0000:53:00.0")}, nic.Accelerators)
	})

	t.Run("every NIC, four per GPU", func(t *testing.T) {
		r := railsFor(append(p5EFA(t), local(t)...), fabric.RequireDeviceRMA, facts, root)
		require.Empty(t, r.Err)
		require.Len(t, r.Rails, 32)
		m := nearest(r)
		for k, gpu := range []string{"53", "64", "75", "86", "97", "a8", "b9", "ca"} {
			assert.Equal(t, []int{4 * k, 4*k + 1, 4*k + 2, 4*k + 3}, m["device 0000:"+gpu+":00.0"], "GPU %s", gpu)
		}
		var node0, node1 []int
		for i := 0; i < 16; i++ {
			node0, node1 = append(node0, i), append(node1, 16+i)
		}
		assert.Equal(t, node0, m["host node 0"])
		assert.Equal(t, node1, m["host node 1"])
		assert.Len(t, m, 10)
		assert.Equal(t, "rdmap201s0", r.Rails[31].NIC.Name, "0000:c9:00.0")
	})
}
