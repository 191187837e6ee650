package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// maxBridges bounds the upstream bridges of a device. Real trees are a
// few levels deep (root port, switch ports); a deeper chain is a broken
// or hostile tree.
const maxBridges = 32

// Tree reads the PCI topology under a sysfs root.
type Tree struct {
	// Root is the sysfs mount: "/sys" in production, a recorded tree in
	// tests.
	Root string
}

// Device is a PCI function and where it sits.
type Device struct {
	Addr PCIAddr
	// Bridges are the PCI bridges above the device, the root port first:
	// the path below the host bridge (the devices/pciDDDD:BB directory,
	// which is not a bridge here). Devices that share a bridge reach
	// each other without crossing the host bridge.
	Bridges []PCIAddr
	// NUMANode is the node of the device's host bridge, -1 when sysfs
	// does not know (numa_node missing or -1).
	NUMANode int
	Class    uint32 // PCI class code, e.g. 0x030200 (3D controller); 0 when missing
	Vendor   uint16 // e.g. 0x10de; 0 when missing
	ID       uint16 // PCI device id, e.g. 0x2330; 0 when missing
}

// Device resolves Root/bus/pci/devices/<addr> to its directory under
// Root/devices and reads the device's bridges, numa_node, class, vendor
// and device files. A missing attribute file is unknown, not an error; a
// garbled one is.
func (t Tree) Device(addr PCIAddr) (Device, error) {
	d, err := t.deviceAt(filepath.Join(t.Root, "bus", "pci", "devices", addr.String()))
	if err == nil && d.Addr != addr {
		err = fmt.Errorf("%s resolves to PCI device %s", filepath.Join(t.Root, "bus", "pci", "devices", addr.String()), d.Addr)
	}
	return d, err
}

// deviceAt reads the device whose sysfs directory link is at link.
func (t Tree) deviceAt(link string) (Device, error) {
	root, err := filepath.EvalSymlinks(filepath.Join(t.Root, "devices"))
	if err != nil {
		return Device{}, fmt.Errorf("sysfs devices directory: %w", err)
	}
	// EvalSymlinks gives up after 255 links, so a loop is an error here.
	dir, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Device{}, fmt.Errorf("%s: %w", link, err)
	}
	rel, err := filepath.Rel(root, dir)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return Device{}, fmt.Errorf("%s resolves to %s, outside %s", link, dir, root)
	}
	parts := strings.Split(rel, string(filepath.Separator))
	// parts[0] is the host bridge ("pci0000:00"), then bridges, then the device.
	if !strings.HasPrefix(parts[0], "pci") || len(parts) < 2 {
		return Device{}, fmt.Errorf("%s resolves to %s, not below a PCI host bridge (%s/pciDDDD:BB)", link, dir, root)
	}
	if len(parts)-2 > maxBridges {
		return Device{}, fmt.Errorf("%s resolves to %s: more than %d bridges above it", link, dir, maxBridges)
	}
	var d Device
	for i, p := range parts[1:] {
		a, err := ParsePCIAddr(p)
		if err != nil {
			return Device{}, fmt.Errorf("%s resolves to %s: component %d: %w", link, dir, i+2, err)
		}
		d.Bridges = append(d.Bridges, a)
	}
	d.Addr, d.Bridges = d.Bridges[len(d.Bridges)-1], d.Bridges[:len(d.Bridges)-1]
	node, err := readInt(filepath.Join(dir, "numa_node"), 10, -1)
	if err != nil {
		return Device{}, err
	}
	d.NUMANode = int(node)
	if d.NUMANode < -1 {
		return Device{}, fmt.Errorf("%s: numa_node %d", filepath.Join(dir, "numa_node"), node)
	}
	class, err := readInt(filepath.Join(dir, "class"), 0, 0)
	if err != nil {
		return Device{}, err
	}
	vendor, err := readInt(filepath.Join(dir, "vendor"), 0, 0)
	if err != nil {
		return Device{}, err
	}
	id, err := readInt(filepath.Join(dir, "device"), 0, 0)
	if err != nil {
		return Device{}, err
	}
	if class < 0 || class > 0xffffff || vendor < 0 || vendor > 0xffff || id < 0 || id > 0xffff {
		return Device{}, fmt.Errorf("%s: class %#x, vendor %#x or device %#x out of range", dir, class, vendor, id)
	}
	d.Class, d.Vendor, d.ID = uint32(class), uint16(vendor), uint16(id)
	return d, nil
}

// readInt reads a one-number sysfs attribute ("0", "-1", "0x030200");
// base 0 takes the 0x prefix. A missing file gives def.
func readInt(path string, base int, def int64) (int64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return def, nil
	}
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, base, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", path, s)
	}
	return n, nil
}

// sharedBridges is how many upstream bridges a and b have in common: 0
// when they meet only at a host bridge or not at all.
func sharedBridges(a, b Device) int {
	n := 0
	for n < len(a.Bridges) && n < len(b.Bridges) && a.Bridges[n] == b.Bridges[n] {
		n++
	}
	return n
}
