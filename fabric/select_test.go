package fabric

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// Machines, from recorded fi_info outputs (testdata/fi_info, each file
// names its source): the EFA infos of a p4d.24xlarge (libfabric 1.22) and
// a p5.48xlarge (libfabric 2.0), next to shm and tcp;ofi_rxm as libfabric
// 2.1 reports them on this project's machine.
type machine struct {
	efa   []Info
	local []Info // shm, tcp;ofi_rxm
}

func (m machine) infos() []Info { return append(append([]Info(nil), m.efa...), m.local...) }

func localInfos(t testing.TB) []Info {
	return append(fixture(t, "local_shm_rdm_v_2.1.txt"), fixture(t, "local_tcp_ofi_rxm_rdm_v_2.1.txt")...)
}

// p5Machine: the p5 output is verbose, so its infos carry their caps.
func p5Machine(t testing.TB) machine {
	return machine{efa: fixture(t, "p5.48xlarge_efa_v_2.0.txt"), local: localInfos(t)}
}

// p4dMachine: the p4d output is the short form, without caps. The efa
// fabric's RDM info gets the same caps on every device:
// efa_prov_info_alloc_for_rdm adds the RMA caps whatever the device can do
// (prov/efa/src/efa_prov_info.c@v2.1.0:550-565), which the p5 output shows.
// The caps are taken from there.
func p4dMachine(t testing.TB) machine {
	efa := fixture(t, "p4d.24xlarge_efa_rdm_1.22.txt")
	caps := fixture(t, "p5.48xlarge_efa_v_2.0.txt")[0].Caps
	for i := range efa {
		efa[i].Caps = caps
	}
	return machine{efa: efa, local: localInfos(t)}
}

// efaDirect is an efa-direct info for libfabric 2.1+, whose FI_RMA depends
// on the device (efa_prov_info.c@v2.1.0:470-479). No published fi_info
// output of efa-direct with its caps was found, so it is built here.
func efaDirect(domain string, rma bool) Info {
	var i Info
	i.Caps = CapMsg | ofi.CapSend | ofi.CapRecv | CapLocalComm | CapRemoteComm
	if rma {
		i.Caps |= RMACaps
	}
	i.EP.Type = EPRDM
	i.Fabric.ProvName, i.Fabric.Name = "efa", "efa-direct"
	i.Domain.Name = domain
	return i
}

func TestSelect(t *testing.T) {
	p5, p4d := p5Machine(t), p4dMachine(t)
	local := localInfos(t)
	tcpFabric := local[len(local)-1].Fabric.Name // every tcp info here is 192.0.2.0/24
	p5Facts := Facts{DeviceRMA: map[string]DeviceRMA{"rdmap79s0-rdm": {Read: Yes, Write: Yes}}}
	// What fi_getopt answers on p4d's devices: use_device_rdma is on
	// (the device has RDMA read) and there is no RDMA write.
	p4dFacts := Facts{DeviceRMA: map[string]DeviceRMA{"rdmap16s27-rdm": {Read: Yes, Write: No}, "rdmap32s27-rdm": {Read: Yes, Write: No}}}
	offFacts := Facts{DeviceRMA: map[string]DeviceRMA{"rdmap16s27-rdm": {Read: No, Write: No}}}
	p5Direct := append([]Info{efaDirect("rdmap79s0-rdm", true)}, p5.infos()...)
	p4dDirect := append([]Info{efaDirect("rdmap16s27-rdm", false)}, p4d.infos()...)

	tests := []struct {
		name         string
		infos        []Info
		loc          Locality
		policy       RMAPolicy
		facts        Facts
		wantBackend  Backend
		wantDomain   string
		wantFabric   string
		wantEmulated []string
		wantReason   string // substring
	}{
		{"same process is a copy", p5.infos(), SameProcess, RequireDeviceRMA, p5Facts, BackendMemcpy, "", "", nil, "memcpy"},
		{"P5 remote uses efa device RMA", p5.infos(), Remote, RequireDeviceRMA, p5Facts, BackendEFA, "rdmap79s0-rdm", "efa", nil, "efa: device does RDMA read and write"},
		{"P5 same node uses shm", p5.infos(), SameNode, RequireDeviceRMA, p5Facts, BackendSHM, "shm", "shm", nil, "shm: peer is on this node"},
		{"P5 with efa-direct (2.1+) uses it", p5Direct, Remote, RequireDeviceRMA, p5Facts, BackendEFADirect, "rdmap79s0-rdm", "efa-direct", nil, "device does RDMA read and write"},
		{"P4d falls back to tcp by default", p4d.infos(), Remote, RequireDeviceRMA, p4dFacts, BackendTCP, "eth0", tcpFabric, nil,
			"efa: RDMA read on the device, write emulated (P4d-class: the device or this libfabric has no device RDMA write); emulated RMA not allowed (policy require-device); using tcp;ofi_rxm"},
		{"P4d with emulation allowed uses efa, writes emulated", p4d.infos(), Remote, AllowEmulatedRMA, p4dFacts, BackendEFA, "rdmap16s27-rdm", "efa", []string{"write"},
			"RDMA read on the device, write emulated (P4d-class: the device or this libfabric has no device RDMA write); using efa with write emulated"},
		{"P4d efa-direct without FI_RMA is passed over", p4dDirect, Remote, AllowEmulatedRMA, p4dFacts, BackendEFA, "rdmap16s27-rdm", "efa", []string{"write"}, "write emulated"},
		{"P4d same node still uses shm", p4d.infos(), SameNode, RequireDeviceRMA, p4dFacts, BackendSHM, "shm", "shm", nil, "shm"},
		{"device RDMA off on the endpoint emulates both", p4d.infos(), Remote, AllowEmulatedRMA, offFacts, BackendEFA, "rdmap16s27-rdm", "efa", []string{"read", "write"},
			"read and write emulated: device RDMA is off on this endpoint (FI_EFA_USE_DEVICE_RDMA off, or no RDMA read on the device)"},
		{"cannot tell: tcp", p4d.infos(), Remote, RequireDeviceRMA, Facts{}, BackendTCP, "eth0", tcpFabric, nil, "cannot tell whether RMA runs on the device"},
		{"cannot tell, emulation allowed: efa", p4d.infos(), Remote, AllowEmulatedRMA, Facts{}, BackendEFA, "rdmap16s27-rdm", "efa", []string{"read", "write"}, "using efa with read and write emulated"},
		{"no EFA remote is tcp", local, Remote, RequireDeviceRMA, Facts{}, BackendTCP, "eth0", tcpFabric, nil, "no RDMA provider"},
		{"no EFA same node is shm", local, SameNode, RequireDeviceRMA, Facts{}, BackendSHM, "shm", "shm", nil, "shm"},
		{"no shm same node is tcp", fixture(t, "local_tcp_ofi_rxm_rdm_v_2.1.txt"), SameNode, RequireDeviceRMA, Facts{}, BackendTCP, "eth0", tcpFabric, nil, "shm: not available; using tcp;ofi_rxm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Select(tt.infos, tt.loc, tt.policy, tt.facts)
			require.NoError(t, err)
			assert.Equal(t, tt.wantBackend, c.Backend, c.Reason)
			assert.Equal(t, tt.wantEmulated, c.Emulated)
			assert.Contains(t, c.Reason, tt.wantReason)
			if tt.wantBackend == BackendMemcpy {
				assert.Nil(t, c.Info)
				return
			}
			require.NotNil(t, c.Info)
			assert.Equal(t, tt.wantDomain, c.Info.Domain.Name)
			assert.Equal(t, tt.wantFabric, c.Info.Fabric.Name)
		})
	}
}

func TestSelectNothingUsable(t *testing.T) {
	none := []Info{{EP: EPAttr{Type: EPRDM}, Caps: CapMsg, Fabric: FabricAttr{ProvName: "udp;ofi_rxd", Name: "udp"}}}
	for _, loc := range []Locality{SameNode, Remote} {
		_, err := Select(none, loc, RequireDeviceRMA, Facts{})
		var nb *NoBackendError
		require.ErrorAs(t, err, &nb)
		assert.Contains(t, err.Error(), "udp;ofi_rxd/udp (FI_EP_RDM)")
		assert.Contains(t, err.Error(), "need an RDM endpoint with FI_RMA")
	}
	_, err := Select(nil, Remote, RequireDeviceRMA, Facts{})
	assert.ErrorContains(t, err, "found: none")
}

func TestSelectOnThisMachine(t *testing.T) {
	infos, err := GetInfo(Query{Hints: RMAHints("")})
	require.NoError(t, err)
	facts := ProbeDeviceRMA(infos)

	c, err := Select(infos, SameNode, RequireDeviceRMA, facts)
	require.NoError(t, err)
	assert.Equal(t, BackendSHM, c.Backend, c.Reason)

	c, err = Select(infos, Remote, RequireDeviceRMA, facts)
	require.NoError(t, err)
	for _, in := range infos {
		if in.Fabric.ProvName == "efa" {
			t.Skipf("this machine has EFA: remote backend is %s (%s)", c.Backend, c.Reason)
		}
	}
	assert.Equal(t, BackendTCP, c.Backend, c.Reason)
}
