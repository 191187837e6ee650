package topology

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ranked is Rank's answer as addresses, for readable failures.
func ranked(tr Tree, nics []PCIAddr, mem Location) []string {
	var out []string
	for _, i := range tr.Rank(nics, mem) {
		out = append(out, nics[i].String())
	}
	return out
}

// p4d.24xlarge: four PCIe switches, each with one EFA NIC and two A100s;
// switches 0-1 on NUMA node 0, 2-3 on node 1 (testdata/README.md).
var p4dNICs = []string{"0000:10:1b.0", "0000:20:1b.0", "0000:90:1b.0", "0000:a0:1b.0"}

func TestRankP4d(t *testing.T) {
	tr := Tree{Root: loadSysfs(t, "p4d.24xlarge")}
	nics := addrs(t, p4dNICs...)
	a, b, c, d := p4dNICs[0], p4dNICs[1], p4dNICs[2], p4dNICs[3]
	for _, tc := range []struct {
		name string
		mem  Location
		want []string
	}{
		{"GPU0 10:1c", DeviceMemory(addr(t, "0000:10:1c.0")), []string{a, b, c, d}},
		{"GPU1 10:1d", DeviceMemory(addr(t, "0000:10:1d.0")), []string{a, b, c, d}},
		{"GPU2 20:1c", DeviceMemory(addr(t, "0000:20:1c.0")), []string{b, a, c, d}},
		{"GPU3 20:1d", DeviceMemory(addr(t, "0000:20:1d.0")), []string{b, a, c, d}},
		{"GPU4 90:1c", DeviceMemory(addr(t, "0000:90:1c.0")), []string{c, d, a, b}},
		{"GPU5 90:1d", DeviceMemory(addr(t, "0000:90:1d.0")), []string{c, d, a, b}},
		{"GPU6 a0:1c", DeviceMemory(addr(t, "0000:a0:1c.0")), []string{d, c, a, b}},
		{"GPU7 a0:1d", DeviceMemory(addr(t, "0000:a0:1d.0")), []string{d, c, a, b}},
		{"host node 0", HostMemory(0), []string{a, b, c, d}},
		{"host node 1", HostMemory(1), []string{c, d, a, b}},
		{"host node 2 (no NIC there)", HostMemory(2), []string{a, b, c, d}},
		{"host node unknown", HostMemory(-1), []string{a, b, c, d}},
		{"unknown location", Location{}, []string{a, b, c, d}},
		{"memory on a device not in the tree", DeviceMemory(addr(t, "0000:33:00.0")), []string{a, b, c, d}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ranked(tr, nics, tc.mem), "memory: %s", tc.mem)
		})
	}

	t.Run("ties keep input order", func(t *testing.T) {
		rev := addrs(t, d, c, b, a)
		assert.Equal(t, []string{b, a, d, c}, ranked(tr, rev, DeviceMemory(addr(t, "0000:20:1c.0"))))
		assert.Equal(t, []string{d, c, b, a}, ranked(tr, rev, HostMemory(1)))
	})
	t.Run("no NICs", func(t *testing.T) {
		assert.Empty(t, tr.Rank(nil, HostMemory(0)))
	})
}

// TestNearest: the head of Rank's order, ties included.
func TestNearest(t *testing.T) {
	near := func(tr Tree, nics []PCIAddr, mem Location) []string {
		var out []string
		for _, i := range tr.Nearest(nics, mem) {
			out = append(out, nics[i].String())
		}
		return out
	}
	t.Run("p4d.24xlarge", func(t *testing.T) {
		tr := Tree{Root: loadSysfs(t, "p4d.24xlarge")}
		nics := addrs(t, p4dNICs...)
		a, b, c, d := p4dNICs[0], p4dNICs[1], p4dNICs[2], p4dNICs[3]
		assert.Equal(t, []string{a}, near(tr, nics, DeviceMemory(addr(t, "0000:10:1c.0"))))
		assert.Equal(t, []string{d}, near(tr, nics, DeviceMemory(addr(t, "0000:a0:1d.0"))))
		assert.Equal(t, []string{a, b}, near(tr, nics, HostMemory(0)))
		assert.Equal(t, []string{c, d}, near(tr, nics, HostMemory(1)))
		assert.Equal(t, []string{a, b, c, d}, near(tr, nics, HostMemory(2)), "no NIC on the node: none is nearer")
		assert.Equal(t, []string{a, b, c, d}, near(tr, nics, Location{}))
		assert.Empty(t, tr.Nearest(nil, HostMemory(0)))
	})
	t.Run("p5.48xlarge", func(t *testing.T) {
		tr := Tree{Root: loadSysfs(t, "p5.48xlarge")}
		all := p5NICs()
		nics := addrs(t, all...)
		for _, sw := range p5Switches {
			assert.Equal(t, sw.nics, near(tr, nics, DeviceMemory(addr(t, sw.gpu))), "GPU %s", sw.gpu)
		}
		assert.Equal(t, all[:16], near(tr, nics, HostMemory(0)))
	})
}

func TestAccelerators(t *testing.T) {
	got, err := Tree{Root: loadSysfs(t, "p4d.24xlarge")}.Accelerators()
	require.NoError(t, err)
	var gpus []PCIAddr
	for _, bus := range []string{"10", "20", "90", "a0"} {
		gpus = append(gpus, addrs(t, "0000:"+bus+":1c.0", "0000:"+bus+":1d.0")...)
	}
	assert.Equal(t, gpus, got, "the eight A100s, NICs left out")

	got, err = Tree{Root: t.TempDir()}.Accelerators()
	require.NoError(t, err)
	assert.Empty(t, got)
}

// p5.48xlarge: eight PCIe switches, each with one H100 and four EFA NICs;
// switches 0-3 on NUMA node 0, 4-7 on node 1 (testdata/README.md).
var p5Switches = []struct {
	sw   string // the switch's upstream port
	gpu  string
	nics []string
	node int
}{
	{"0000:45:00.0", "0000:53:00.0", []string{"0000:4f:00.0", "0000:50:00.0", "0000:51:00.0", "0000:52:00.0"}, 0},
	{"0000:56:00.0", "0000:64:00.0", []string{"0000:60:00.0", "0000:61:00.0", "0000:62:00.0", "0000:63:00.0"}, 0},
	{"0000:67:00.0", "0000:75:00.0", []string{"0000:71:00.0", "0000:72:00.0", "0000:73:00.0", "0000:74:00.0"}, 0},
	{"0000:78:00.0", "0000:86:00.0", []string{"0000:82:00.0", "0000:83:00.0", "0000:84:00.0", "0000:85:00.0"}, 0},
	{"0000:89:00.0", "0000:97:00.0", []string{"0000:93:00.0", "0000:94:00.0", "0000:95:00.0", "0000:96:00.0"}, 1},
	{"0000:9a:00.0", "0000:a8:00.0", []string{"0000:a4:00.0", "0000:a5:00.0", "0000:a6:00.0", "0000:a7:00.0"}, 1},
	{"0000:ab:00.0", "0000:b9:00.0", []string{"0000:b5:00.0", "0000:b6:00.0", "0000:b7:00.0", "0000:b8:00.0"}, 1},
	{"0000:bc:00.0", "0000:ca:00.0", []string{"0000:c6:00.0", "0000:c7:00.0", "0000:c8:00.0", "0000:c9:00.0"}, 1},
}

// p5NICs are the 32 NICs of p5Switches, in switch order.
func p5NICs() []string {
	var all []string
	for _, s := range p5Switches {
		all = append(all, s.nics...)
	}
	return all
}

func TestRankP5(t *testing.T) {
	tr := Tree{Root: loadSysfs(t, "p5.48xlarge")}
	nics := addrs(t, p5NICs()...)
	// want: the GPU's four NICs, then the other NICs of its node, then
	// the rest, each group in input order.
	for _, sw := range p5Switches {
		t.Run("GPU "+sw.gpu, func(t *testing.T) {
			want := append([]string(nil), sw.nics...)
			for _, pass := range []bool{true, false} {
				for _, o := range p5Switches {
					if o.gpu != sw.gpu && (o.node == sw.node) == pass {
						want = append(want, o.nics...)
					}
				}
			}
			assert.Equal(t, want, ranked(tr, nics, DeviceMemory(addr(t, sw.gpu))))
		})
	}
	for _, node := range []int{0, 1} {
		t.Run("host node "+strconv.Itoa(node), func(t *testing.T) {
			var want, rest []string
			for _, s := range p5Switches {
				if s.node == node {
					want = append(want, s.nics...)
				} else {
					rest = append(rest, s.nics...)
				}
			}
			assert.Equal(t, append(want, rest...), ranked(tr, nics, HostMemory(node)))
		})
	}
}

func TestDevice(t *testing.T) {
	p4d := Tree{Root: loadSysfs(t, "p4d.24xlarge")}
	p5 := Tree{Root: loadSysfs(t, "p5.48xlarge")}
	for _, c := range []struct {
		tree Tree
		addr string
		want Device
	}{
		{p4d, "0000:10:1b.0", Device{Bridges: addrs(t, "0000:00:01.0", "0000:0f:00.0"), NUMANode: 0, Class: 0x020000, Vendor: 0x1d0f, ID: 0xefa0}},
		{p4d, "0000:a0:1d.0", Device{Bridges: addrs(t, "0000:80:02.0", "0000:9f:00.0"), NUMANode: 1, Class: 0x030200, Vendor: 0x10de, ID: 0x20b0}},
		{p5, "0000:53:00.0", Device{Bridges: addrs(t, "0000:44:01.0", "0000:45:00.0", "0000:46:04.0"), NUMANode: 0, Class: 0x030200, Vendor: 0x10de, ID: 0x2330}},
		{p5, "0000:c9:00.0", Device{Bridges: addrs(t, "0000:bb:01.0", "0000:bc:00.0", "0000:bd:03.0"), NUMANode: 1, Class: 0x020000, Vendor: 0x1d0f, ID: 0xefa1}},
	} {
		t.Run(c.addr, func(t *testing.T) {
			c.want.Addr = addr(t, c.addr)
			d, err := c.tree.Device(c.want.Addr)
			require.NoError(t, err)
			assert.Equal(t, c.want, d)
		})
	}
}

// TestDegrades breaks a p4d tree one way per case: Device names the path
// that broke it, and Rank falls back to input order (or ranks the broken
// NIC last) instead of failing.
func TestDegrades(t *testing.T) {
	const (
		gpu0Dir = "devices/pci0000:00/0000:00:01.0/0000:0f:00.0/0000:10:1c.0"
		nic2Dir = "devices/pci0000:80/0000:80:01.0/0000:8f:00.0/0000:90:1b.0"
	)
	a, b, c, d := p4dNICs[0], p4dNICs[1], p4dNICs[2], p4dNICs[3]
	gpu0 := "0000:10:1c.0"
	gpu4 := "0000:90:1c.0"
	deep := "devices/pci0000:00"
	for i := 0; i <= maxBridges; i++ {
		deep += "/0000:00:01.0"
	}
	for _, tc := range []struct {
		name    string
		breakIt func(t *testing.T, root string)
		dev     string   // Device(dev) must fail ...
		errHas  string   // ... with this in the message
		mem     string   // device memory for Rank; "" for host node 1
		want    []string // Rank's order
	}{
		{
			name: "GPU link missing",
			breakIt: func(t *testing.T, root string) {
				require.NoError(t, os.Remove(filepath.Join(root, "bus/pci/devices", gpu0)))
			},
			dev: gpu0, errHas: "bus/pci/devices/" + gpu0,
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name:    "GPU numa_node garbled",
			breakIt: func(t *testing.T, root string) { writeFile(t, root, gpu0Dir+"/numa_node", "zero\n") },
			dev:     gpu0, errHas: gpu0Dir + "/numa_node",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name:    "GPU class garbled",
			breakIt: func(t *testing.T, root string) { writeFile(t, root, gpu0Dir+"/class", "\x00\x01\n") },
			dev:     gpu0, errHas: gpu0Dir + "/class",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name:    "GPU link is a loop",
			breakIt: func(t *testing.T, root string) { relink(t, root, gpu0, gpu0) },
			dev:     gpu0, errHas: "bus/pci/devices/" + gpu0,
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name:    "GPU link leaves the devices tree",
			breakIt: func(t *testing.T, root string) { relink(t, root, gpu0, "../../../class") },
			dev:     gpu0, errHas: "outside",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name: "GPU below more than 32 bridges",
			breakIt: func(t *testing.T, root string) {
				writeFile(t, root, deep+"/"+gpu0+"/numa_node", "0\n")
				relink(t, root, gpu0, "../../../"+deep+"/"+gpu0)
			},
			dev: gpu0, errHas: "more than 32 bridges",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name:    "GPU link names another device",
			breakIt: func(t *testing.T, root string) { relink(t, root, gpu0, "../../../"+nic2Dir) },
			dev:     gpu0, errHas: "resolves to PCI device 0000:90:1b.0",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name: "GPU link below a non-PCI directory",
			breakIt: func(t *testing.T, root string) {
				writeFile(t, root, "devices/platform/"+gpu0+"/numa_node", "0\n")
				relink(t, root, gpu0, "../../../devices/platform/"+gpu0)
			},
			dev: gpu0, errHas: "not below a PCI host bridge",
			mem: gpu0, want: []string{a, b, c, d},
		},
		{
			name: "NIC numa_node missing: unknown, not an error; ranks after its node's other NIC",
			breakIt: func(t *testing.T, root string) {
				require.NoError(t, os.Remove(filepath.Join(root, nic2Dir, "numa_node")))
			},
			mem: "", want: []string{d, a, b, c},
		},
		{
			name:    "NIC link dangling: ranks last for its own GPU",
			breakIt: func(t *testing.T, root string) { relink(t, root, c, "../../../devices/pci0000:80/gone") },
			dev:     c, errHas: "bus/pci/devices/" + c,
			mem: gpu4, want: []string{d, a, b, c},
		},
		{
			name: "every NIC numa_node missing",
			breakIt: func(t *testing.T, root string) {
				for _, n := range p4dNICs {
					dir, err := filepath.EvalSymlinks(filepath.Join(root, "bus/pci/devices", n))
					require.NoError(t, err)
					require.NoError(t, os.Remove(filepath.Join(dir, "numa_node")))
				}
			},
			mem: "", want: []string{a, b, c, d},
		},
		{
			name:    "no sysfs at all",
			breakIt: func(t *testing.T, root string) { require.NoError(t, os.RemoveAll(root)) },
			dev:     gpu0, errHas: "devices",
			mem: gpu0, want: []string{a, b, c, d},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := loadSysfs(t, "p4d.24xlarge")
			tc.breakIt(t, root)
			tr := Tree{Root: root}
			if tc.dev != "" {
				_, err := tr.Device(addr(t, tc.dev))
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.errHas)
			}
			mem := HostMemory(1)
			if tc.mem != "" {
				mem = DeviceMemory(addr(t, tc.mem))
			}
			assert.Equal(t, tc.want, ranked(tr, addrs(t, p4dNICs...), mem))
		})
	}
}

func relink(t *testing.T, root, dev, target string) {
	t.Helper()
	p := filepath.Join(root, "bus/pci/devices", dev)
	require.NoError(t, os.Remove(p))
	require.NoError(t, os.Symlink(target, p))
}
