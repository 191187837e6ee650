package topology

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
)

// PCIAddr is a PCI function address (domain:bus:device.function), as in
// sysfs names and libfabric's fi_pci_attr.
type PCIAddr struct {
	Domain   uint16
	Bus      uint8
	Device   uint8 // 0..31
	Function uint8 // 0..7
}

// String formats a as sysfs names it: "0000:10:1b.0".
func (a PCIAddr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// MarshalText formats a as String does, so reports show "0000:10:1b.0".
func (a PCIAddr) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText parses what MarshalText wrote.
func (a *PCIAddr) UnmarshalText(b []byte) error {
	p, err := ParsePCIAddr(string(b))
	if err != nil {
		return err
	}
	*a = p
	return nil
}

// ParsePCIAddr parses "dddd:bb:dd.f" (hex; the form sysfs and lspci -D
// use). The domain is at most 4 hex digits: VMD domains (10000 and up)
// do not parse.
func ParsePCIAddr(s string) (PCIAddr, error) {
	bad := func(why string) (PCIAddr, error) {
		return PCIAddr{}, fmt.Errorf("PCI address %q: %s (want dddd:bb:dd.f)", s, why)
	}
	dom, rest, ok1 := strings.Cut(s, ":")
	bus, rest, ok2 := strings.Cut(rest, ":")
	dev, fn, ok3 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || !ok3 {
		return bad("not of the form")
	}
	var v [4]uint64
	for i, f := range []struct {
		s    string
		n    int // hex digits
		max  uint64
		name string
	}{{dom, 4, 0xffff, "domain"}, {bus, 2, 0xff, "bus"}, {dev, 2, 31, "device"}, {fn, 1, 7, "function"}} {
		if len(f.s) != f.n {
			return bad(fmt.Sprintf("%s has %d hex digits, not %d", f.name, len(f.s), f.n))
		}
		n, err := strconv.ParseUint(f.s, 16, 16)
		if err != nil {
			return bad(f.name + " is not hex")
		}
		if n > f.max {
			return bad(fmt.Sprintf("%s %#x > %#x", f.name, n, f.max))
		}
		v[i] = n
	}
	return PCIAddr{Domain: uint16(v[0]), Bus: uint8(v[1]), Device: uint8(v[2]), Function: uint8(v[3])}, nil
}

// InfoAddr is the PCI address fi_info gives for in's NIC; false when it
// gives none (tcp, shm).
func InfoAddr(in *fabric.Info) (PCIAddr, bool) {
	if in.NIC == nil || in.NIC.Bus == nil || in.NIC.Bus.PCI == nil {
		return PCIAddr{}, false
	}
	p := in.NIC.Bus.PCI
	return PCIAddr{Domain: p.DomainID, Bus: p.BusID, Device: p.DeviceID, Function: p.FunctionID}, true
}
