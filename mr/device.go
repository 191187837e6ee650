package mr

import (
	"fmt"

	"github.com/fitransfer/fitransfer/fabric"
)

// Iface is the kind of memory a registration covers (libfabric's enum
// fi_hmem_iface).
type Iface int

// Memory kinds.
const (
	// Host is ordinary host memory.
	Host Iface = fabric.HMEMSystem
	// CUDA is NVIDIA GPU memory (cudaMalloc).
	CUDA Iface = fabric.HMEMCUDA
)

func (i Iface) String() string {
	switch i {
	case Host:
		return "host"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("iface(%d)", int(i))
}

// Device is device memory to register: its address in the process's
// address space (as the device runtime returns it), length, kind and
// device number. fitransfer never reads it from the CPU.
type Device struct {
	Ptr    uintptr
	Len    uint64
	Iface  Iface
	Device int // e.g. the CUDA device ordinal
	// PCIBusID is the device's PCI address ("0000:10:1c.0", as
	// cudaDeviceGetPCIBusId gives it), or "": with it, a manager with
	// several rails sends this memory's transfers that are not striped
	// over the NICs nearest the device.
	PCIBusID string
}

// Check validates the description.
func (d Device) Check() error {
	switch {
	case d.Ptr == 0 || d.Len == 0:
		return fmt.Errorf("device memory: empty region (pointer %#x, %d bytes)", d.Ptr, d.Len)
	case d.Iface != CUDA:
		return fmt.Errorf("device memory: kind %v is not supported (cuda is)", d.Iface)
	case d.Device < 0:
		return fmt.Errorf("device memory: device %d", d.Device)
	}
	return nil
}
