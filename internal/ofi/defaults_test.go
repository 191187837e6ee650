package ofi

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// defaultsChild, set in a child's environment, makes TestProviderDefaults
// the child's: libfabric initializes there first (this process
// initialized it long ago). "keep" calls KeepProviderDefaults first.
const defaultsChild = "FITRANSFER_TEST_DEFAULTS_CHILD"

// TestProviderDefaults: on libfabric 2.x shm initializes with its CMA off
// unless the user set FI_SHM_DISABLE_CMA (then shm reads the user's
// value) or KeepProviderDefaults came first (fi_info's defaults); on 1.x
// nothing is set. The variable is gone from the environment once
// libfabric initialized, so that processes started later keep their own
// defaults. What shm read is in libfabric's own log.
func TestProviderDefaults(t *testing.T) {
	if mode, ok := os.LookupEnv(defaultsChild); ok {
		if mode == "keep" {
			KeepProviderDefaults()
		}
		_, err := GetInfo(NegotiatedVersion(), "", "", 0, nil)
		require.NoError(t, err)
		v, set := os.LookupEnv(ShmDisableCMA)
		fmt.Printf("after: set=%v value=%q off=%v\n", set, v, ShmCMAOffByDefault())
		return
	}
	v2 := RuntimeVersion().Major() >= 2
	for _, tc := range []struct {
		name, mode string
		user       *string // FI_SHM_DISABLE_CMA in the child's environment
		read       string  // what libfabric logs of shm's disable_cma
		after      string
	}{
		{"default", "", nil,
			map[bool]string{true: "read bool var disable_cma=1", false: "variable disable_cma=<not set>"}[v2],
			map[bool]string{true: `after: set=false value="" off=true`, false: `after: set=false value="" off=false`}[v2]},
		{"user's value", "", ptr("0"), "read bool var disable_cma=0", `after: set=true value="0" off=false`},
		{"kept defaults", "keep", nil, "variable disable_cma=<not set>", `after: set=false value="" off=false`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestProviderDefaults$", "-test.count=1")
			env := []string{defaultsChild + "=" + tc.mode, "FI_LOG_LEVEL=info"}
			if tc.user != nil {
				env = append(env, ShmDisableCMA+"="+*tc.user)
			}
			cmd.Env = append(withoutEnv(os.Environ(), ShmDisableCMA, "FI_LOG_LEVEL", "FI_LOG_PROV"), env...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			var seen []string // libfabric logs much more
			for _, line := range strings.Split(string(out), "\n") {
				if strings.Contains(line, "disable_cma") || strings.HasPrefix(line, "after:") {
					seen = append(seen, line)
				}
			}
			got := strings.Join(seen, "\n")
			assert.Contains(t, got, tc.read)
			assert.Contains(t, got, tc.after)
		})
	}
}

func ptr(s string) *string { return &s }

// withoutEnv is env without the variables named.
func withoutEnv(env []string, names ...string) []string {
	var out []string
	for _, kv := range env {
		keep := true
		for _, n := range names {
			keep = keep && !strings.HasPrefix(kv, n+"=")
		}
		if keep {
			out = append(out, kv)
		}
	}
	return out
}
