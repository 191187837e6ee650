package floor

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
)

func TestMain(m *testing.M) {
	// Measure starts this binary as its peer.
	if handled, err := ServePeer(); handled {
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	testenv.LoopbackOnly()
	os.Exit(m.Run())
}

// peerArgs run this test binary as the peer only: no test of its own.
var peerArgs = []string{"-test.run=^$"}

// TestMeasure: every test over shm and tcp;ofi_rxm finishes and reports
// a time per op.
func TestMeasure(t *testing.T) {
	for _, prov := range []string{testenv.RouteSHM, testenv.RouteTCP} {
		for _, test := range []Test{Write, Read, PingPong} {
			t.Run(string(test)+"/"+prov, func(t *testing.T) {
				testenv.RequireRoute(t, prov)
				usec, err := Measure(context.Background(), os.Args[0], peerArgs, prov, test, 2000, fabric.OpDeliveryComplete)
				require.NoError(t, err)
				assert.Greater(t, usec, 0.0)
			})
		}
	}
}

// TestMeasureUnknownProvider: a provider that does not exist is an
// error that names it, not a hang.
func TestMeasureUnknownProvider(t *testing.T) {
	_, err := Measure(context.Background(), os.Args[0], peerArgs, "no-such-provider", Write, 10, fabric.OpDeliveryComplete)
	require.ErrorContains(t, err, "no-such-provider")
}

// TestMeasureUnknownTest: a test Measure does not know is refused before
// any process starts.
func TestMeasureUnknownTest(t *testing.T) {
	_, err := Measure(context.Background(), os.Args[0], peerArgs, testenv.RouteSHM, "atomics", 10, fabric.OpDeliveryComplete)
	require.ErrorContains(t, err, `unknown test "atomics"`)
}

// TestMeasurePeerExitsFirst: a peer that exits before it sends its
// address is an error, not a panic or a hang.
func TestMeasurePeerExitsFirst(t *testing.T) {
	exe, err := exec.LookPath("true")
	require.NoError(t, err)
	_, err = Measure(context.Background(), exe, nil, testenv.RouteSHM, Write, 10, fabric.OpDeliveryComplete)
	require.ErrorContains(t, err, "peer")
}
