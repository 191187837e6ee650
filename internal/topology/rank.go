package topology

import (
	"fmt"
	"sort"
)

// Location is where the memory of a transfer lives: on a PCI device
// (DeviceMemory) or in host memory on a NUMA node (HostMemory). The zero
// Location is unknown: Rank keeps the input order for it.
type Location struct {
	kind locKind
	dev  PCIAddr
	node int
}

type locKind uint8

const (
	locUnknown locKind = iota
	locDevice
	locHost
)

// DeviceMemory is memory on the PCI device at addr (a GPU, a Neuron device).
func DeviceMemory(addr PCIAddr) Location { return Location{kind: locDevice, dev: addr} }

// HostMemory is host memory on NUMA node node (HostNode finds it); a
// negative node is unknown.
func HostMemory(node int) Location {
	if node < 0 {
		return Location{}
	}
	return Location{kind: locHost, node: node}
}

// String describes l: "device 0000:10:1c.0", "host node 1" or "unknown".
func (l Location) String() string {
	switch l.kind {
	case locDevice:
		return "device " + l.dev.String()
	case locHost:
		return fmt.Sprintf("host node %d", l.node)
	}
	return "unknown"
}

// Rank orders nics for memory at mem and returns their indices, best
// first. For device memory: NICs sharing upstream bridges with the device
// (the deepest shared bridge first, so the device's own PCIe switch
// leads), then NICs on the device's NUMA node, then the rest. For host
// memory: NICs on the memory's node, then the rest. Ties keep input
// order. Rank does not fail: a NIC it cannot read ranks last, and when
// the device of mem cannot be read, or mem is unknown, the order is the
// input order.
func (t Tree) Rank(nics []PCIAddr, mem Location) []int {
	order, _ := t.rank(nics, mem)
	return order
}

// Nearest is the head of Rank's order: the NICs Rank puts first and
// those it ranks equal to them, in Rank's order. For a GPU of a p4d that
// is the NIC behind its switch; of a p5, the four behind its switch; for
// host memory, the NICs on its node. With nothing to go by (mem unknown
// or unreadable, or no NIC nearer than another) it is every NIC.
func (t Tree) Nearest(nics []PCIAddr, mem Location) []int {
	order, keys := t.rank(nics, mem)
	n := 0
	for n < len(order) && keys[order[n]] == keys[order[0]] {
		n++
	}
	return order[:n]
}

// rankKey is how near a NIC is to the memory Rank orders for.
type rankKey struct {
	shared   int  // bridges shared with the memory's device
	sameNode bool // on the memory's NUMA node
}

// rank is Rank's order and each NIC's key (all zero when mem is unknown
// or its device unreadable).
func (t Tree) rank(nics []PCIAddr, mem Location) ([]int, []rankKey) {
	order := make([]int, len(nics))
	for i := range order {
		order[i] = i
	}
	keys := make([]rankKey, len(nics))
	var memDev Device
	node := -1
	switch mem.kind {
	case locDevice:
		d, err := t.Device(mem.dev)
		if err != nil {
			return order, keys
		}
		memDev, node = d, d.NUMANode
	case locHost:
		node = mem.node
	default:
		return order, keys
	}
	for i, a := range nics {
		nd, err := t.Device(a)
		if err != nil {
			continue
		}
		keys[i] = rankKey{sameNode: node >= 0 && nd.NUMANode == node}
		if mem.kind == locDevice {
			keys[i].shared = sharedBridges(memDev, nd)
		}
	}
	sort.SliceStable(order, func(x, y int) bool {
		a, b := keys[order[x]], keys[order[y]]
		if a.shared != b.shared {
			return a.shared > b.shared
		}
		return a.sameNode && !b.sameNode
	})
	return order, keys
}
