package fabric

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// SysfsRoot is where EFADevices looks for /sys; tests point it elsewhere.
const SysfsRoot = "/sys"

// EFADevice is an EFA device as sysfs shows it.
type EFADevice struct {
	Name      string `json:"name"`       // RDMA device name, e.g. "rdmap16s27"
	PCIDevice string `json:"pci_device"` // PCI device id, e.g. "0xefa1"
	// ReadLikely is a guess from the PCI id, used only where libfabric
	// cannot be asked safely: first-generation devices (0xefa0) have no
	// RDMA read, later ones do. Not verified against every instance type.
	ReadLikely Tristate `json:"read_likely"`
}

// EFADevices lists the EFA devices under root/class/infiniband (vendor
// 0x1d0f, PCI id 0xefaN). A missing directory is not an error: no devices.
func EFADevices(root string) ([]EFADevice, error) {
	dir := filepath.Join(root, "class", "infiniband")
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []EFADevice
	for _, e := range entries {
		dev := filepath.Join(dir, e.Name(), "device")
		vendor := readTrim(filepath.Join(dev, "vendor"))
		id := readTrim(filepath.Join(dev, "device"))
		if vendor != "0x1d0f" || !strings.HasPrefix(id, "0xefa") {
			continue
		}
		d := EFADevice{Name: e.Name(), PCIDevice: id, ReadLikely: Yes}
		if id == "0xefa0" {
			d.ReadLikely = No
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// AbortTrapError says that calling into the efa provider would abort the
// process, and how to avoid it.
type AbortTrapError struct {
	Device string
}

func (e *AbortTrapError) Error() string {
	return fmt.Sprintf("FI_EFA_USE_DEVICE_RDMA is set but EFA device %s (first generation) has no RDMA read: "+
		"the efa provider would abort() the process; unset FI_EFA_USE_DEVICE_RDMA", e.Device)
}

var abortTrap struct {
	once sync.Once
	err  error
}

// EFAAbortTrap reports (once per process) whether FI_EFA_USE_DEVICE_RDMA
// is set on a device without RDMA read. libfabric 1.17 aborts in efa's
// provider init (the first fi_getinfo), 1.18+ when an efa endpoint or
// domain is opened; fitransfer checks before either.
func EFAAbortTrap() error {
	abortTrap.once.Do(func() { abortTrap.err = efaAbortTrapAt(SysfsRoot) })
	return abortTrap.err
}

func efaAbortTrapAt(root string) error {
	if !EnvTruthy("FI_EFA_USE_DEVICE_RDMA") {
		return nil
	}
	devs, _ := EFADevices(root)
	for _, d := range devs {
		if d.ReadLikely == No {
			return &AbortTrapError{Device: d.Name}
		}
	}
	return nil
}
