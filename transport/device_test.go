package transport_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// This machine has no GPU and no CUDA runtime: device memory must fail
// with an error that says so, never crash.
func TestDeviceMemoryWithoutHMEMSupport(t *testing.T) {
	host := alloc(t, 1<<20) // stands in for a device pointer: mapped, so nothing can fault
	dev := mr.Device{Ptr: mr.Addr(host), Len: 1 << 20, Iface: mr.CUDA}

	plain := newManager(t)
	_, err := plain.RegisterDevice(dev, mr.ReadWrite)
	assert.ErrorIs(t, err, transport.ErrDeviceMemory)
	assert.ErrorContains(t, err, "WithDeviceMemory")

	m, err := transport.New(context.Background(), transport.WithDeviceMemory())
	if err != nil {
		t.Logf("no manager with device memory: %v", err)
		assert.ErrorIs(t, err, transport.ErrDeviceMemory)
		assert.ErrorContains(t, err, "FI_HMEM")
		return
	}
	defer m.Close()
	var providers []string
	for _, b := range m.Backends() {
		providers = append(providers, b.Provider)
	}
	t.Logf("backends with FI_HMEM: %v", providers)
	_, err = m.RegisterDevice(dev, mr.ReadWrite)
	require.Error(t, err, "registering CUDA memory cannot work without CUDA")
	t.Logf("register: %v", err)
	assert.Contains(t, err.Error(), "cuda")
	assert.True(t, strings.Contains(err.Error(), "no CUDA runtime") || errors.Is(err, transport.ErrDeviceMemory), err.Error())

	// Host memory still registers on that manager.
	b, err := m.Register(host, mr.ReadWrite)
	require.NoError(t, err)
	require.NoError(t, b.Close())
}

func TestDeviceDescriptionChecks(t *testing.T) {
	for _, d := range []mr.Device{
		{Ptr: 0, Len: 10, Iface: mr.CUDA},
		{Ptr: 4096, Len: 0, Iface: mr.CUDA},
		{Ptr: 4096, Len: 10, Iface: mr.Host},
		{Ptr: 4096, Len: 10, Iface: mr.CUDA, Device: -1},
	} {
		assert.Error(t, d.Check(), "%+v", d)
	}
	assert.NoError(t, mr.Device{Ptr: 4096, Len: 10, Iface: mr.CUDA}.Check())
}
