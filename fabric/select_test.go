package fabric

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// synth builds an fi_info the way a provider reports it, with the fields
// Select reads.
func synth(prov, fabricName, domain string, ep EPType, caps Caps) Info {
	var i Info
	i.Caps = caps
	i.EP.Type = ep
	i.Fabric.ProvName = prov
	i.Fabric.Name = fabricName
	i.Domain.Name = domain
	return i
}

const efaMsgCaps = CapMsg | ofi.CapSend | ofi.CapRecv | CapLocalComm | CapRemoteComm

var (
	shmInfo = synth("shm", "shm", "shm", EPRDM, RMACaps|CapLocalComm)
	tcpInfo = synth("tcp;ofi_rxm", "172.31.0.0/20", "ens32", EPRDM, RMACaps|CapLocalComm|CapRemoteComm)
	// The shape of fi_getinfo's answer on each machine kind, modelled on
	// libfabric 2.1's efa_prov_info.c: efa-direct claims FI_RMA only when
	// the device has RDMA read, write and unsolicited write; the efa
	// (RDM protocol) fabric always claims FI_RMA.
	p5 = []Info{
		synth("efa", "efa-direct", "rdmap85s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa", "rdmap85s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa", "rdmap85s0-dgrm", ofi.EPDgram, efaMsgCaps),
		shmInfo, tcpInfo,
	}
	p5en = []Info{ // several devices; the first one is picked
		synth("efa", "efa-direct", "rdmap79s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa-direct", "rdmap80s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa", "rdmap79s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa", "rdmap80s0-rdm", EPRDM, efaMsgCaps|RMACaps),
		shmInfo, tcpInfo,
	}
	p4d = []Info{
		synth("efa", "efa-direct", "rdmap16s27-rdm", EPRDM, efaMsgCaps), // no FI_RMA: no RDMA write
		synth("efa", "efa", "rdmap16s27-rdm", EPRDM, efaMsgCaps|RMACaps),
		synth("efa", "efa", "rdmap16s27-dgrm", ofi.EPDgram, efaMsgCaps),
		shmInfo, tcpInfo,
	}
	p4dOld = []Info{ // libfabric before efa-direct (< 2.1)
		synth("efa", "EFA-fe80::4b0:12ff:fe34:5678", "rdmap16s27-rdm", EPRDM, efaMsgCaps|RMACaps),
		shmInfo, tcpInfo,
	}
	noEFA = []Info{shmInfo, tcpInfo, synth("tcp", "172.31.0.0/20", "ens32", ofi.EPMsg, RMACaps)}
	noSHM = []Info{tcpInfo}
	none  = []Info{synth("udp;ofi_rxd", "udp", "lo", EPRDM, CapMsg)}
)

var (
	p5Facts    = Facts{DeviceRMA: map[string]DeviceRMA{"rdmap85s0-rdm": {Read: Yes, Write: Yes}}}
	p5enFacts  = Facts{DeviceRMA: map[string]DeviceRMA{"rdmap79s0-rdm": {Read: Yes, Write: Yes}, "rdmap80s0-rdm": {Read: Yes, Write: Yes}}}
	p4dFacts   = Facts{DeviceRMA: map[string]DeviceRMA{"rdmap16s27-rdm": {Read: Yes, Write: No}}}
	gen1Facts  = Facts{DeviceRMA: map[string]DeviceRMA{"rdmap16s27-rdm": {Read: No, Write: No}}}
	unknownRMA = Facts{}
)

func TestSelect(t *testing.T) {
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
		{"same process is a copy", p5, SameProcess, RequireDeviceRMA, p5Facts, BackendMemcpy, "", "", nil, "memcpy"},
		{"P5 remote uses efa-direct", p5, Remote, RequireDeviceRMA, p5Facts, BackendEFADirect, "rdmap85s0-rdm", "efa-direct", nil, "device does RDMA read and write"},
		{"P5 same node uses shm", p5, SameNode, RequireDeviceRMA, p5Facts, BackendSHM, "shm", "shm", nil, "shm: peer is on this node"},
		{"P5en picks its first device", p5en, Remote, RequireDeviceRMA, p5enFacts, BackendEFADirect, "rdmap79s0-rdm", "efa-direct", nil, "efa-direct"},
		{"P5 without efa-direct uses efa device RMA", p5[1:], Remote, RequireDeviceRMA, p5Facts, BackendEFA, "rdmap85s0-rdm", "efa", nil, "efa: device does RDMA read and write"},
		{"P4d falls back to tcp by default", p4d, Remote, RequireDeviceRMA, p4dFacts, BackendTCP, "ens32", "172.31.0.0/20", nil,
			"efa: device has RDMA read but not write (P4d-class); emulated RMA not allowed (policy require-device); using tcp;ofi_rxm"},
		{"P4d with emulation allowed uses efa, writes emulated", p4d, Remote, AllowEmulatedRMA, p4dFacts, BackendEFA, "rdmap16s27-rdm", "efa", []string{"write"},
			"device has RDMA read but not write (P4d-class); using efa with write emulated"},
		{"P4d same node still uses shm", p4d, SameNode, RequireDeviceRMA, p4dFacts, BackendSHM, "shm", "shm", nil, "shm"},
		{"first-generation EFA emulates both", p4d, Remote, AllowEmulatedRMA, gen1Facts, BackendEFA, "rdmap16s27-rdm", "efa", []string{"read", "write"}, "neither RDMA read nor write"},
		{"old libfabric cannot tell: tcp", p4dOld, Remote, RequireDeviceRMA, unknownRMA, BackendTCP, "ens32", "172.31.0.0/20", nil, "cannot tell whether RMA runs on the device"},
		{"old libfabric cannot tell, emulation allowed: efa", p4dOld, Remote, AllowEmulatedRMA, unknownRMA, BackendEFA, "rdmap16s27-rdm", "EFA-fe80::4b0:12ff:fe34:5678", []string{"read", "write"}, "using efa with read and write emulated"},
		{"no EFA remote is tcp", noEFA, Remote, RequireDeviceRMA, Facts{}, BackendTCP, "ens32", "172.31.0.0/20", nil, "no RDMA provider"},
		{"no EFA same node is shm", noEFA, SameNode, RequireDeviceRMA, Facts{}, BackendSHM, "shm", "shm", nil, "shm"},
		{"no shm same node is tcp", noSHM, SameNode, RequireDeviceRMA, Facts{}, BackendTCP, "ens32", "172.31.0.0/20", nil, "shm: not available; using tcp;ofi_rxm"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Select(tt.infos, tt.loc, tt.policy, tt.facts)
			require.NoError(t, err)
			assert.Equal(t, tt.wantBackend, c.Backend)
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
