package doctor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/transport"
)

func TestMain(m *testing.M) {
	if handled, code := MaybeRunCMAChild(); handled {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func byName(r Report) map[string]Check {
	m := map[string]Check{}
	for _, c := range r.Checks {
		m[c.Name] = c
	}
	return m
}

func TestRunOnThisMachine(t *testing.T) {
	t.Setenv(transport.RailsEnv, "")
	r := Run(Options{})
	checks := byName(r)
	for _, name := range []string{"libfabric", "efa-use-device-rdma", "providers", "efa", "shm-space", "shm-cma", "memlock", "fi-env", "device-memory", "backend-same-node", "backend-remote", "rails", "manager-open"} {
		require.Contains(t, checks, name)
	}
	// No GPU here: shm answers FI_HMEM hints all the same (1.17 and 2.1),
	// but where the headers have FI_OPT_CUDA_API_PERMITTED libfabric says
	// it found no CUDA.
	dm := checks["device-memory"].Detail
	assert.Contains(t, dm, "FI_HMEM from shm")
	if r.Headers.CUDAAPIPermitted {
		assert.Contains(t, dm, "no CUDA library or device")
	} else {
		assert.Contains(t, dm, "not compiled in")
	}
	for _, c := range r.Checks {
		if c.Status != Pass {
			assert.NotEmpty(t, c.Fix, "%s is %s without a fix", c.Name, c.Status)
		}
	}
	assert.True(t, r.OK, r.Verdict)
	assert.Equal(t, Pass, checks["backend-same-node"].Status)
	if ok, _ := transport.MemAvailable(); ok {
		assert.True(t, strings.HasPrefix(checks["backend-same-node"].Detail, "mem — "), "what transport uses first: %s", checks["backend-same-node"].Detail)
		assert.Contains(t, r.Verdict, "same node over mem")
	}
	if ok, _ := transport.CMAAvailable(); ok {
		assert.Contains(t, checks["backend-same-node"].Detail, "cma")
	} else {
		assert.Contains(t, checks["backend-same-node"].Detail, "shm")
	}
	assert.Equal(t, Pass, checks["shm-cma"].Status, checks["shm-cma"].Detail)
	assert.Equal(t, Pass, checks["manager-open"].Status, checks["manager-open"].Detail)
	assert.Contains(t, checks["manager-open"].Detail, "a Manager with default options opens ")
	assert.Contains(t, checks["providers"].Detail, "tcp")
	// No EFA here: the remote provider is tcp;ofi_rxm, whose one rail has
	// no PCI address.
	require.NotNil(t, r.Rails)
	assert.Equal(t, string(fabric.BackendTCP), r.Rails.Provider)
	assert.Equal(t, Pass, checks["rails"].Status, checks["rails"].Detail)
	assert.Contains(t, r.Rails.Note, "no PCI address")
}

func TestShmSpace(t *testing.T) {
	c := checkShmSpace(filepath.Join(t.TempDir(), "missing"))
	assert.Equal(t, Fail, c.Status)
	assert.Contains(t, c.Fix, "--shm-size")

	// A path that is no directory cannot take a file, whoever asks.
	notDir := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(notDir, nil, 0o644))
	c = checkShmSpace(notDir)
	assert.Equal(t, Fail, c.Status)
	assert.Contains(t, c.Detail, "not writable")

	// A directory without write permission: root writes there anyway
	// (CAP_DAC_OVERRIDE), so the check passes for root and fails for
	// everyone else.
	ro := t.TempDir()
	require.NoError(t, os.Chmod(ro, 0o555))
	c = checkShmSpace(ro)
	if os.Geteuid() == 0 {
		assert.NotEqual(t, Fail, c.Status, c.Detail)
		assert.Contains(t, c.Detail, "MiB free")
	} else {
		assert.Equal(t, Fail, c.Status)
		assert.Contains(t, c.Detail, "not writable")
	}

	c = checkShmSpace(t.TempDir())
	assert.NotEqual(t, Fail, c.Status)
	assert.Contains(t, c.Detail, "MiB free")
}

func TestCMAProbeFailsCleanly(t *testing.T) {
	// A target that is not the probe child: the probe must fail with an
	// error, within its deadline, not hang.
	err := probeCMA(context.Background(), "/bin/true")
	require.Error(t, err)
}

func TestCMAProbeWorksHere(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	require.NoError(t, probeCMA(context.Background(), exe))
}

func TestEFAWithoutProviderFails(t *testing.T) {
	devs := []fabric.EFADevice{{Name: "rdmap16s27", PCIDevice: "0xefa0"}}
	c := checkEFA(devs, nil, nil, fabric.Facts{})
	assert.Equal(t, Fail, c.Status)
	assert.Contains(t, c.Fix, "/dev/infiniband")

	efa := fabric.Info{}
	efa.Fabric.ProvName = "efa"
	c = checkEFA(devs, nil, []fabric.Info{efa}, fabric.Facts{DeviceRMA: map[string]fabric.DeviceRMA{
		"rdmap16s27-rdm": {Read: fabric.Yes, Write: fabric.No}}})
	assert.Equal(t, Warn, c.Status)
	assert.Contains(t, c.Detail, "RDMA read on device, write emulated")
	assert.Contains(t, c.Fix, "--allow-emulated")
}

func TestFIEnv(t *testing.T) {
	t.Setenv("FI_PROVIDER", "tcp")
	c := checkFIEnv()
	assert.Equal(t, Warn, c.Status)
	assert.Contains(t, c.Detail, "FI_PROVIDER=tcp")
}

// TestAbortTrapCheck: the variable as each libfabric reads it, and the
// gate's refusal with its fix.
func TestAbortTrapCheck(t *testing.T) {
	v117, v21 := fabric.MakeVersion(1, 17), fabric.MakeVersion(2, 1)

	t.Setenv(fabric.EnvUseDeviceRDMA, "true")
	c := checkAbortTrap(v117, nil)
	assert.Equal(t, Warn, c.Status)
	assert.Contains(t, c.Detail, "reads with strtol as 0")
	assert.Contains(t, c.Fix, "1 turns device RDMA on")
	assert.Equal(t, Pass, checkAbortTrap(v21, nil).Status)

	t.Setenv(fabric.EnvUseDeviceRDMA, "y")
	c = checkAbortTrap(v21, nil)
	assert.Equal(t, Warn, c.Status)
	assert.Contains(t, c.Detail, "opening an efa endpoint aborts")

	t.Setenv(fabric.EnvUseDeviceRDMA, "1")
	assert.Equal(t, Pass, checkAbortTrap(v117, nil).Status)
	trap := &fabric.AbortTrapError{Call: "fi_getinfo", Library: "1.17.0", Setting: fabric.ReadDeviceRDMASetting(v117), API: v117}
	c = checkAbortTrap(v117, trap)
	assert.Equal(t, Fail, c.Status)
	assert.Contains(t, c.Fix, "unset FI_EFA_USE_DEVICE_RDMA")
}

func TestEFAEndpointTrapFails(t *testing.T) {
	efa := fabric.Info{}
	efa.Fabric.ProvName = "efa"
	trap := &fabric.AbortTrapError{Call: "efa endpoint open (rdmap16s27-rdm)", Library: "2.1.0",
		Setting: fabric.DeviceRDMASetting{Set: true, Raw: "y"}, API: fabric.MakeVersion(2, 1)}
	c := checkEFA([]fabric.EFADevice{{Name: "rdmap16s27", PCIDevice: "0xefa0"}}, nil, []fabric.Info{efa}, fabric.Facts{EFAEndpoint: trap})
	assert.Equal(t, Fail, c.Status)
	assert.Contains(t, c.Detail, "efa endpoint open")
	assert.Contains(t, c.Fix, "one of 0/1/false/true/no/yes/off/on")
}
