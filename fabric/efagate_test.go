package fabric

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// fakeProbe stands in for the probe child: it records the plans asked of
// it and answers with what libfabric on the machine under test would do.
type fakeProbe struct {
	plans  []probePlan
	answer probeResult
}

func (f *fakeProbe) run(p probePlan) probeResult {
	f.plans = append(f.plans, p)
	return f.answer
}

func testGate(rt string, env string, set bool, fp *fakeProbe) gate {
	var v Version
	if err := v.UnmarshalText([]byte(rt)); err != nil {
		panic(err)
	}
	return gate{library: rt + ".0", runtime: v, api: v, setting: deviceRDMASetting(v, env, set), probe: fp.run,
		inproc: func(*Info) (DeviceRMA, error) { return DeviceRMA{}, errors.New("no in-process probe in this test") }}
}

// libfabric on a p4d: its devices have RDMA read (a maintainer,
// ofiwg/libfabric#8186: a user "could FI_EFA_USE_DEVICE_RDMA=1 on p4d");
// efa_rdm_get_use_device_rdma aborts with the variable true only without
// read (efa_rdm_util.c@v2.1.0:65-70), so the child survives, and fi_getopt
// reports read on the device and write emulated.
var p4dAnswer = probeResult{
	Domains: []string{"rdmap16s27-rdm", "rdmap32s27-rdm"},
	RMA: map[string]DeviceRMA{
		"rdmap16s27-rdm": {Read: Yes, Write: No},
		"rdmap32s27-rdm": {Read: Yes, Write: No},
	},
}

// TestP4dWithUseDeviceRDMA: FI_EFA_USE_DEVICE_RDMA=1 on a p4d (recorded
// fi_info, libfabric 1.22) neither refuses fi_getinfo nor keeps efa from
// being used: reads run on the device, writes are emulated and used only
// when allowed, else tcp with the reason.
func TestP4dWithUseDeviceRDMA(t *testing.T) {
	m := p4dMachine(t)
	fp := &fakeProbe{answer: p4dAnswer}
	g := testGate("1.22", "1", true, fp)

	require.NoError(t, g.getInfoTrap())
	assert.Empty(t, fp.plans, "1.18+ fi_getinfo reads nothing that aborts: no probe")

	facts := g.facts(m.infos())
	require.NoError(t, facts.EFAEndpoint)
	require.Len(t, fp.plans, 1)
	assert.Equal(t, []string{stepGetInfo, stepEndpoints}, fp.plans[0].steps, "a child opens the endpoints")
	assert.Equal(t, DeviceRMA{Read: Yes, Write: No}, facts.DeviceRMA["rdmap16s27-rdm"])

	c, err := Select(m.infos(), Remote, AllowEmulatedRMA, facts)
	require.NoError(t, err)
	assert.Equal(t, BackendEFA, c.Backend, c.Reason)
	assert.Equal(t, []string{"write"}, c.Emulated)

	c, err = Select(m.infos(), Remote, RequireDeviceRMA, facts)
	require.NoError(t, err)
	assert.Equal(t, BackendTCP, c.Backend)
	assert.Contains(t, c.Reason, "write emulated")
	assert.Contains(t, c.Reason, "emulated RMA not allowed")
}

// TestP4dWithUseDeviceRDMA117: the same on libfabric 1.17, where every
// fi_getinfo runs the check: a child makes the call first and survives.
func TestP4dWithUseDeviceRDMA117(t *testing.T) {
	m := p4dMachine(t)
	fp := &fakeProbe{answer: probeResult{Domains: p4dAnswer.Domains}}
	g := testGate("1.17", "1", true, fp)
	require.NoError(t, g.getInfoTrap())
	require.Len(t, fp.plans, 1)
	assert.Equal(t, []string{stepGetInfo}, fp.plans[0].steps)

	facts := g.facts(m.infos())
	require.NoError(t, facts.EFAEndpoint)
	assert.Len(t, fp.plans, 1, "1.17 endpoint open reads nothing that aborts")
	// use_device_rdma is the variable; 1.17 has no device RDMA write.
	assert.Equal(t, DeviceRMA{Read: Yes, Write: No}, facts.DeviceRMA["rdmap32s27-rdm"])
}

// TestAbortInProbeRefuses: where the child aborts, fitransfer refuses with
// libfabric's words and the fix, and does not make the call itself.
func TestAbortInProbeRefuses(t *testing.T) {
	msg := "FI_EFA_USE_DEVICE_RDMA=1 was set by users, but EFA device has no rdma-read capability."
	fp := &fakeProbe{answer: probeResult{Aborted: true, Call: "fi_getinfo", Message: msg}}
	err := testGate("1.17", "1", true, fp).getInfoTrap()
	var trap *AbortTrapError
	require.ErrorAs(t, err, &trap)
	assert.Equal(t, "fi_getinfo", trap.Call)
	assert.Contains(t, err.Error(), msg)
	assert.Contains(t, trap.Fix(), "unset FI_EFA_USE_DEVICE_RDMA")

	// 1.18+: the endpoint open aborts; efa is passed over, tcp carries.
	fp = &fakeProbe{answer: probeResult{Aborted: true, Call: "efa endpoint open (rdmap16s27-rdm)",
		Message: "FI_EFA_USE_DEVICE_RDMA was set to an invalid value by the user."}}
	m := p4dMachine(t)
	facts := testGate("2.1", "y", true, fp).facts(m.infos())
	require.ErrorAs(t, facts.EFAEndpoint, &trap)
	assert.Contains(t, trap.Fix(), "one of 0/1/false/true/no/yes/off/on")
	c, err := Select(m.infos(), Remote, AllowEmulatedRMA, facts)
	require.NoError(t, err)
	assert.Equal(t, BackendTCP, c.Backend)
	assert.Contains(t, c.Reason, "would abort() this process in efa endpoint open (rdmap16s27-rdm)")
}

// TestNoProbeWithoutRisk: no child where libfabric cannot abort.
func TestNoProbeWithoutRisk(t *testing.T) {
	for _, tt := range []struct {
		rt, env string
		set     bool
	}{
		{"1.17", "", false},
		{"1.17", "0", true},
		{"1.17", "true", true}, // strtol reads 0
		{"2.1", "1", true},     // fi_getinfo without FI_HMEM never reads it
		{"2.1", "y", true},
	} {
		fp := &fakeProbe{}
		assert.NoError(t, testGate(tt.rt, tt.env, tt.set, fp).getInfoTrap(), "%+v", tt)
		assert.Empty(t, fp.plans, "%+v", tt)
	}
	// The FI_HMEM path aborts only on a value fi_parse_bool rejects.
	fp := &fakeProbe{}
	assert.NoError(t, testGate("2.1", "1", true, fp).hmemTrap())
	assert.Empty(t, fp.plans)
	assert.NoError(t, testGate("2.1", "y", true, fp).hmemTrap())
	require.Len(t, fp.plans, 1)
	assert.Equal(t, []string{stepGetInfo, stepHMEM}, fp.plans[0].steps)
	// No efa infos: no endpoint probe.
	fp = &fakeProbe{}
	testGate("2.1", "1", true, fp).facts(localInfos(t))
	assert.Empty(t, fp.plans)
}

// TestProbeFailure: a child that cannot answer is not taken as "safe"
// where this process sees a risk.
func TestProbeFailure(t *testing.T) {
	m := p4dMachine(t)
	fp := &fakeProbe{answer: probeResult{Err: errors.New("exec: no such file")}}
	facts := testGate("2.1", "1", true, fp).facts(m.infos())
	var pe *ProbeError
	require.ErrorAs(t, facts.EFAEndpoint, &pe)

	// Without the variable, API 1.18+ cannot abort at endpoint open: the
	// endpoint is probed in this process instead.
	g := testGate("2.1", "", false, fp)
	g.inproc = func(*Info) (DeviceRMA, error) { return DeviceRMA{Read: Yes, Write: No}, nil }
	facts = g.facts(m.infos())
	require.NoError(t, facts.EFAEndpoint)
	assert.Equal(t, DeviceRMA{Read: Yes, Write: No}, facts.DeviceRMA["rdmap16s27-rdm"])

	var pe2 *ProbeError
	require.ErrorAs(t, testGate("1.17", "1", true, fp).getInfoTrap(), &pe2)
}

// TestProbeChildHere runs the real child (this test binary) on this
// machine, which has no EFA device: it survives and finds no efa domain.
func TestProbeChildHere(t *testing.T) {
	r := runProbe(probePlan{api: APIVersion(), steps: []string{stepGetInfo, stepEndpoints}})
	require.NoError(t, r.Err)
	assert.False(t, r.Aborted)
	assert.Empty(t, r.Domains)
}

// TestProbeChildAbortIsCaught: a real abort() in the child kills only the
// child; the parent learns which call it was in and the last words.
func TestProbeChildAbortIsCaught(t *testing.T) {
	r := runProbe(probePlan{api: APIVersion(), steps: []string{stepGetInfo, stepAbort}})
	require.NoError(t, r.Err)
	assert.True(t, r.Aborted)
	assert.Equal(t, "abort (test)", r.Call)
	assert.Equal(t, "fitransfer probe child: abort() requested by a test", r.Message)
}

func TestProbeChildNotAChild(t *testing.T) {
	r := runProbeExe("/bin/true", probePlan{api: APIVersion(), steps: []string{stepGetInfo}})
	assert.Error(t, r.Err)
	assert.False(t, r.Aborted)
}

// TestEndpointGuardWired: internal/ofi asks the gate before an efa RDM
// endpoint open in every process that links this package.
func TestEndpointGuardWired(t *testing.T) {
	require.NotNil(t, ofi.BeforeEFAEndpoint)
	_, inChild := os.LookupEnv(probeChildEnv)
	assert.False(t, inChild)
}
