package fabric

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SysfsRoot is where EFADevices looks for /sys; tests point it elsewhere.
const SysfsRoot = "/sys"

// EFADevice is an EFA device as sysfs shows it. It is shown to users (the
// doctor, `fitransfer info`) and decides nothing: what a device can do is
// libfabric's answer — the efa-direct fabric's caps, fi_getopt on an
// endpoint, or whether a probe child survived (EFAGetInfoGate,
// ProbeDeviceRMA). libfabric itself tests capability bits of the device,
// not its PCI id (prov/efa/src/efa_device.c@v2.1.0:244-249).
type EFADevice struct {
	Name      string `json:"name"`       // RDMA device name, e.g. "rdmap16s27"
	PCIDevice string `json:"pci_device"` // PCI device id, e.g. "0xefa0"
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
		out = append(out, EFADevice{Name: e.Name(), PCIDevice: id})
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
