package test

import (
	"errors"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testenv"
)

// TestServeClientOfTheOtherIPFamily: a client that reaches serve over
// IPv6 (its tcp endpoint then has an IPv6 address) while serve's tcp
// endpoint is IPv4. serve refused every such client, the same-node
// routes' too, because one of the client's endpoint names was of the
// other family (a new user's review: "a tcp;ofi_rxm endpoint address of
// 28 bytes (FI_SOCKADDR_IN takes 16)"). The session goes on over mem; tcp
// alone is no route, saying why, and not that the two share no
// provider; with an IPv4 source address tcp works.
func TestServeClientOfTheOtherIPFamily(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteTCP)
	addr, _ := startLocalServerCmd(t, "--listen", "[::1]:0", "-s", "127.0.0.1", "--size", "64k")
	out, err := exec.Command(fitransferBin, "read", addr, "-S", "4k", "-I", "5").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "over mem")

	out, err = exec.Command(fitransferBin, "read", addr, "-p", "tcp", "-S", "4k", "-I", "5").CombinedOutput()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "%v: %s", err, out)
	assert.Equal(t, 1, exit.ExitCode(), string(out))
	assert.Contains(t, string(out), "no route to the buffer's owner: the owner's tcp;ofi_rxm endpoint has an address of the other IP family")
	assert.NotContains(t, string(out), "common -p provider")

	out, err = exec.Command(fitransferBin, "read", addr, "-p", "tcp", "-s", "127.0.0.1", "-S", "4k", "-I", "5").CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Contains(t, string(out), "over tcp;ofi_rxm")
}
