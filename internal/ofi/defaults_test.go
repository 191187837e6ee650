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
// initialized it long ago). Its value is the call that does.
const defaultsChild = "FITRANSFER_TEST_DEFAULTS_CHILD"

// TestProviderDefaults: on libfabric 2.x shm initializes with its CMA off
// unless the user set FI_SHM_DISABLE_CMA (then shm reads the user's
// value); on 1.x nothing is set. The variable is gone from the
// environment once libfabric initialized, so that processes started
// later keep their own defaults, and fi_getparams, as the first call,
// shows the user's environment (fitransfer info -e is fi_info -e). What
// shm read is in libfabric's own log.
func TestProviderDefaults(t *testing.T) {
	if call, ok := os.LookupEnv(defaultsChild); ok {
		shown := "unset"
		if call == "getparams" {
			params, err := Params()
			require.NoError(t, err)
			for _, p := range params {
				if p.Name == ShmDisableCMA && p.Set {
					shown = p.Value
				}
			}
		} else {
			_, err := GetInfo(NegotiatedVersion(), "", "", 0, nil)
			require.NoError(t, err)
		}
		v, set := os.LookupEnv(ShmDisableCMA)
		fmt.Printf("after: set=%v value=%q off=%v shown=%s\n", set, v, ShmCMAOffByDefault(), shown)
		return
	}
	v2 := RuntimeVersion().Major() >= 2
	for _, tc := range []struct {
		name, call string
		user       *string // FI_SHM_DISABLE_CMA in the child's environment
		read       string  // what libfabric logs of shm's disable_cma
		after      string
	}{
		{"default", "getinfo", nil,
			map[bool]string{true: "read bool var disable_cma=1", false: "variable disable_cma=<not set>"}[v2],
			fmt.Sprintf(`after: set=false value="" off=%v shown=unset`, v2)},
		{"default, fi_getparams first", "getparams", nil,
			map[bool]string{true: "read bool var disable_cma=1", false: "variable disable_cma=<not set>"}[v2],
			fmt.Sprintf(`after: set=false value="" off=%v shown=unset`, v2)},
		{"user's 0", "getinfo", ptr("0"), "read bool var disable_cma=0", `after: set=true value="0" off=false shown=unset`},
		{"user's 1", "getparams", ptr("1"), "read bool var disable_cma=1", `after: set=true value="1" off=false shown=1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestProviderDefaults$", "-test.count=1")
			env := []string{defaultsChild + "=" + tc.call, "FI_LOG_LEVEL=info"}
			if tc.user != nil {
				env = append(env, ShmDisableCMA+"="+*tc.user)
			}
			cmd.Env = append(withoutEnv(os.Environ(), ShmDisableCMA, "FI_LOG_LEVEL", "FI_LOG_PROV", "FI_LOG_SUBSYS"), env...)
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
