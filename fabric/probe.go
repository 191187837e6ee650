package fabric

import (
	"errors"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// ProbeDeviceRMA finds out, for every efa RDM domain in infos, whether the
// device does RDMA read and write:
//   - an efa-direct info with FI_RMA means both (libfabric 2.1+ claims
//     FI_RMA there only when the device has read, write and unsolicited
//     write);
//   - otherwise, with API 1.18+ headers and library, it opens a throwaway
//     endpoint and asks fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE);
//   - otherwise the answer stays Unknown.
//
// It never opens an efa endpoint when FI_EFA_USE_DEVICE_RDMA would make the
// provider abort (see EFAAbortTrap).
func ProbeDeviceRMA(infos []Info) Facts {
	facts := Facts{DeviceRMA: map[string]DeviceRMA{}}
	for i := range infos {
		in := &infos[i]
		if isEFADirect(in) && in.Caps.Has(RMACaps) {
			facts.DeviceRMA[in.Domain.Name] = DeviceRMA{Read: Yes, Write: Yes}
		}
	}
	if EFAAbortTrap() != nil {
		return facts
	}
	for i := range infos {
		in := &infos[i]
		if !isEFARDM(in) {
			continue
		}
		if _, known := facts.DeviceRMA[in.Domain.Name]; known {
			continue
		}
		if r, err := probeEmulated(in); err == nil {
			facts.DeviceRMA[in.Domain.Name] = r
		}
	}
	return facts
}

// errNotProbed is returned when the libfabric in use cannot answer.
var errNotProbed = errors.New("libfabric cannot report emulated RMA (needs API 1.18+)")

func probeEmulated(in *Info) (DeviceRMA, error) {
	if !ofi.CompiledVersion().AtLeast(1, 18) || !APIVersion().AtLeast(1, 18) {
		return DeviceRMA{}, errNotProbed
	}
	f, err := OpenFabric(in)
	if err != nil {
		return DeviceRMA{}, err
	}
	defer f.Close()
	d, err := f.OpenDomain(in)
	if err != nil {
		return DeviceRMA{}, err
	}
	defer d.Close()
	emuRead, emuWrite, err := d.ProbeEFAEmulated()
	if err != nil {
		return DeviceRMA{}, err
	}
	r := DeviceRMA{Read: Yes, Write: Yes}
	if emuRead {
		r.Read = No
	}
	if emuWrite {
		r.Write = No
	}
	return r, nil
}
