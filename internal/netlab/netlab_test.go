package netlab

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
)

// TestLab: each rail is the route from A to B's address on it; a cut
// rail is not, until it is restored. (Traffic over the rails is tested
// with the product: test/rails_test.go.)
func TestLab(t *testing.T) {
	testenv.RequireRoot(t)
	l, err := New(2, "100mbit")
	require.NoError(t, err)
	defer func() { assert.NoError(t, l.Close()) }()
	via := func(i int) string {
		out, _ := exec.Command("ip", "-n", l.A, "route", "get", l.AddrB(i)).CombinedOutput()
		return string(out)
	}
	for i := 0; i < 2; i++ {
		assert.Contains(t, via(i), "dev "+l.Iface(i)+" src "+l.AddrA(i))
		_, err := l.Bytes(i)
		require.NoError(t, err)
	}
	require.NoError(t, l.Cut(1))
	assert.NotContains(t, via(1), "dev "+l.Iface(1)+" src")
	require.NoError(t, l.Restore(1))
	assert.Contains(t, via(1), "dev "+l.Iface(1)+" src "+l.AddrA(1))
	assert.Equal(t, "rail0,rail1", l.RailList(2))
}
