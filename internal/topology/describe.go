package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// NIC is a NIC as Describe shows it (in `fitransfer doctor` and `info`).
type NIC struct {
	Addr     PCIAddr `json:"pci"`
	Name     string  `json:"name,omitempty"` // RDMA device, e.g. "rdmap16s27"
	NUMANode int     `json:"numa_node"`      // -1: unknown
	// Switch is the deepest bridge the NIC shares with an accelerator:
	// its PCIe switch, as far as affinity goes. Nil when no accelerator
	// shares a bridge with it.
	Switch *PCIAddr `json:"switch,omitempty"`
	// Accelerators are the GPUs and Neuron devices that share a bridge
	// with the NIC, in address order.
	Accelerators []PCIAddr `json:"accelerators,omitempty"`
	// Err says why the NIC could not be read; the other fields are then
	// what was known.
	Err string `json:"error,omitempty"`
}

// String is one line for a report:
// "0000:10:1b.0 rdmap16s27 numa 0 switch 0000:0f:00.0 with 0000:10:1c.0 0000:10:1d.0".
func (n NIC) String() string {
	var b strings.Builder
	b.WriteString(n.Addr.String())
	if n.Name != "" {
		b.WriteString(" " + n.Name)
	}
	if n.NUMANode >= 0 {
		fmt.Fprintf(&b, " numa %d", n.NUMANode)
	} else {
		b.WriteString(" numa unknown")
	}
	if n.Switch != nil {
		b.WriteString(" switch " + n.Switch.String() + " with")
		for _, a := range n.Accelerators {
			b.WriteString(" " + a.String())
		}
	} else {
		b.WriteString(" no accelerator behind its switch")
	}
	if n.Err != "" {
		b.WriteString(" (" + n.Err + ")")
	}
	return b.String()
}

// Describe shows each of nics (nil: every RDMA device under
// Root/class/infiniband) with its NUMA node, its switch and the
// accelerators behind that switch. It fails only when it cannot list
// Root/bus/pci/devices or Root/class/infiniband; a NIC it cannot read
// carries its error in NIC.Err.
func (t Tree) Describe(nics []PCIAddr) ([]NIC, error) {
	names, err := t.rdmaNames()
	if err != nil {
		return nil, err
	}
	if nics == nil {
		for a := range names {
			nics = append(nics, a)
		}
		sort.Slice(nics, func(i, j int) bool { return less(nics[i], nics[j]) })
	}
	accels, err := t.accelerators()
	if err != nil {
		return nil, err
	}
	out := make([]NIC, 0, len(nics))
	for _, a := range nics {
		n := NIC{Addr: a, Name: names[a], NUMANode: -1}
		d, err := t.Device(a)
		if err != nil {
			n.Err = err.Error()
			out = append(out, n)
			continue
		}
		n.NUMANode = d.NUMANode
		deepest := 0
		for _, g := range accels {
			s := sharedBridges(d, g)
			if s == 0 {
				continue
			}
			n.Accelerators = append(n.Accelerators, g.Addr)
			if s > deepest {
				deepest = s
				sw := d.Bridges[s-1]
				n.Switch = &sw
			}
		}
		out = append(out, n)
	}
	return out, nil
}

// rdmaNames maps PCI addresses to the RDMA devices under
// Root/class/infiniband (none when the directory is missing).
func (t Tree) rdmaNames() (map[PCIAddr]string, error) {
	dir := filepath.Join(t.Root, "class", "infiniband")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	names := make(map[PCIAddr]string, len(entries))
	for _, e := range entries {
		d, err := t.deviceAt(filepath.Join(dir, e.Name(), "device"))
		if err != nil {
			continue // not a PCI device (rxe, siw): no NIC of ours
		}
		names[d.Addr] = e.Name()
	}
	return names, nil
}

// Accelerators lists the GPUs (PCI class 0x0300, 0x0302) and Neuron
// devices under Root/bus/pci/devices, in address order; none when the
// directory is missing. `fitransfer doctor` shows the NICs nearest each.
func (t Tree) Accelerators() ([]PCIAddr, error) {
	devs, err := t.accelerators()
	if err != nil {
		return nil, err
	}
	out := make([]PCIAddr, len(devs))
	for i, d := range devs {
		out[i] = d.Addr
	}
	return out, nil
}

// accelerators lists the GPUs (PCI class 0x0300 VGA, 0x0302 3D
// controller) and Neuron devices under Root/bus/pci/devices, in address
// order. Devices it cannot read are left out.
func (t Tree) accelerators() ([]Device, error) {
	dir := filepath.Join(t.Root, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, e := range entries {
		a, err := ParsePCIAddr(e.Name())
		if err != nil {
			continue
		}
		d, err := t.Device(a)
		if err != nil || !isAccelerator(d) {
			continue
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i].Addr, out[j].Addr) })
	return out, nil
}

// neuronIDs are the PCI device ids of AWS Neuron devices (vendor 0x1d0f):
// Inferentia 0x7064-0x7067, Trainium 0x7164, Inferentia2 0x7264,
// Trainium2 0x7364 (aws-neuron-driver neuron_device.h).
var neuronIDs = map[uint16]bool{0x7064: true, 0x7065: true, 0x7066: true, 0x7067: true, 0x7164: true, 0x7264: true, 0x7364: true}

func isAccelerator(d Device) bool {
	switch d.Class >> 8 {
	case 0x0300, 0x0302:
		return true
	}
	return d.Vendor == 0x1d0f && neuronIDs[d.ID]
}

func less(a, b PCIAddr) bool {
	if a.Domain != b.Domain {
		return a.Domain < b.Domain
	}
	if a.Bus != b.Bus {
		return a.Bus < b.Bus
	}
	if a.Device != b.Device {
		return a.Device < b.Device
	}
	return a.Function < b.Function
}
