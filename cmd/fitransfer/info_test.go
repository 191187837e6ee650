package main

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
)

// fiInfo runs the real fi_info (Debian's libfabric-bin, installed by
// `make deps`).
func fiInfo(t *testing.T, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("fi_info")
	require.NoError(t, err, "fi_info not found: run `make deps` (apt-get install libfabric-bin)")
	out, err := exec.Command(path, args...).Output()
	require.NoError(t, err, "fi_info %v", args)
	return string(out)
}

// shmAddr is an address of the shm provider (or 2.x's sm2), which embeds
// the process id.
var shmAddr = regexp.MustCompile(`fi_(shm|sm2)://\d+`)

// strAddrLens are the address lengths of an fi_info with string
// addresses (shm's "fi_shm://PID..."), which follow the pid's digits.
var strAddrLens = regexp.MustCompile(`(addr_format: FI_ADDR_STR\n\s+src_addrlen: )\d+(\n\s+dest_addrlen: )\d+`)

// samePID replaces the pid in shm addresses, and the address lengths that
// follow its number of digits: fi_info's and ours differ only there,
// because they are different processes.
func samePID(s string) string {
	s = strAddrLens.ReplaceAllString(s, "${1}N${2}N")
	return shmAddr.ReplaceAllString(s, "fi_$1://PID")
}

func TestInfoMatchesFiInfo(t *testing.T) {
	cases := [][]string{
		{},
		{"-p", "tcp"},
		{"-p", "shm"},
		{"-t", "FI_EP_RDM", "-c", "FI_RMA"},
		{"-l"},
		{"-v"},
		{"-v", "-p", "shm"},
		{"-p", "tcp", "-t", "FI_EP_MSG"},
		{"--provider=tcp", "--ep_type=FI_EP_RDM"},
		{"-c", "FI_MSG|FI_RMA", "-m", "FI_CONTEXT"},
		{"-a", "FI_SOCKADDR_IN", "-p", "tcp"},
		{"-n", "127.0.0.1", "-P", "7777", "-p", "tcp"},
		{"-d", "lo", "-p", "tcp"},
		{"-f", "shm"},
		{"-l", "-p", "shm"},
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			want := fiInfo(t, args...)
			got, stderr, code := runCLI(append([]string{"info"}, args...)...)
			require.Equal(t, 0, code, stderr)
			assert.Equal(t, samePID(want), samePID(got))
		})
	}
}

func TestInfoEnvMatchesFiInfo(t *testing.T) {
	// Set variables show as assignments: a plain value, one with a space
	// (quoted) and an empty one. All three are defaults or only narrow
	// logging, so neither process behaves differently.
	t.Setenv("FI_LOG_INTERVAL", "2000")
	t.Setenv("FI_LOG_SUBSYS", "core av")
	t.Setenv("FI_LOG_PROV", "")
	cases := []struct {
		args  []string
		empty bool // the filter matches no variable
	}{
		{args: []string{"-e"}},
		{args: []string{"--env"}},
		{args: []string{"-g", "shm"}},
		{args: []string{"-g", "Log"}}, // case-insensitive, as strcasestr
		{args: []string{"--getenv=tcp"}},
		{args: []string{"-g", ""}}, // every variable
		{args: []string{"-e", "-v"}},
		{args: []string{"-e", "-l", "-p", "tcp"}},
		{args: []string{"-g", "no such variable"}, empty: true},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			want := withoutNULs(fiInfo(t, tc.args...))
			require.Equal(t, tc.empty, want == "", "fi_info's output: %q", want)
			// A process of its own, as fi_info is: which variables exist
			// is libfabric's state in the process that asks.
			cmd := cliCommand(t, append([]string{"info"}, tc.args...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			got, err := cmd.Output()
			require.NoError(t, err, stderr.String())
			assert.Equal(t, want, string(got))
		})
	}
}

// withoutNULs drops the NUL bytes fi_info writes on either side of a value
// without a space (printf's %c of '\0'), which fitransfer leaves out.
func withoutNULs(s string) string { return strings.ReplaceAll(s, "\x00", "") }

func TestInfoEnvRefusesJSON(t *testing.T) {
	_, stderr, code := runCLI("info", "-g", "log", "--json")
	assert.Equal(t, exitUsage, code, stderr)
}

func TestInfoJSON(t *testing.T) {
	out, stderr, code := runCLI("info", "--json", "-p", "tcp")
	require.Equal(t, 0, code, stderr)
	var r struct {
		Libfabric map[string]string `json:"libfabric"`
		Infos     []struct {
			Caps       []string `json:"caps"`
			AddrFormat string   `json:"addr_format"`
			SrcAddr    struct {
				Str string `json:"str"`
			} `json:"src_addr"`
			EP struct {
				Type       string `json:"type"`
				MaxMsgSize uint64 `json:"max_msg_size"`
			} `json:"ep_attr"`
			Domain struct {
				Name   string   `json:"name"`
				MRMode []string `json:"mr_mode"`
			} `json:"domain_attr"`
			Fabric struct {
				ProvName    string `json:"prov_name"`
				ProvVersion string `json:"prov_version"`
			} `json:"fabric_attr"`
		} `json:"infos"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.NotEmpty(t, r.Libfabric["library"])
	require.NotEmpty(t, r.Infos)
	// The JSON says what the summary says, in the same order.
	summary := fiInfo(t, "-p", "tcp")
	var i int
	for _, line := range strings.Split(summary, "\n") {
		if strings.HasPrefix(line, "    domain: ") {
			require.Less(t, i, len(r.Infos))
			assert.Equal(t, strings.TrimPrefix(line, "    domain: "), r.Infos[i].Domain.Name)
			i++
		}
	}
	assert.Equal(t, len(r.Infos), i)
	for _, in := range r.Infos {
		assert.Contains(t, []string{"tcp", "tcp;ofi_rxm"}, in.Fabric.ProvName)
		assert.Contains(t, in.Caps, "FI_MSG")
		assert.NotEmpty(t, in.SrcAddr.Str)
		assert.NotEmpty(t, in.EP.Type)
	}

	out, stderr, code = runCLI("info", "--json", "-l")
	require.Equal(t, 0, code, stderr)
	var l struct {
		Providers []struct{ Name, Version string } `json:"providers"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &l))
	assert.NotEmpty(t, l.Providers)
}

// TestInfoRails: --rails prints doctor's rails section, alone; without
// it info stays fi_info (TestInfoMatchesFiInfo).
func TestInfoRails(t *testing.T) {
	t.Setenv("FITRANSFER_RAILS", "")
	doc, _, _ := runCLI("doctor")
	out, stderr, code := runCLI("info", "--rails")
	require.Equal(t, exitOK, code, stderr)
	// No EFA here: tcp;ofi_rxm's one rail, without a PCI address.
	assert.Regexp(t, `^rails: 1 of tcp;ofi_rxm \(`, out)
	assert.Contains(t, out, "fi_info gives no PCI address")
	assert.Contains(t, doc, out, "the same section as doctor's")

	out, stderr, code = runCLI("info", "--rails", "--json")
	require.Equal(t, exitOK, code, stderr)
	var r struct {
		Provider string `json:"provider"`
		Rails    []struct {
			Rail   int    `json:"rail"`
			Domain string `json:"domain"`
		} `json:"rails"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.Equal(t, "tcp;ofi_rxm", r.Provider)
	require.Len(t, r.Rails, 1)
	assert.NotEmpty(t, r.Rails[0].Domain)

	_, stderr, code = runCLI("info", "--rails", "-p", "efa")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "--rails takes no other flag than --json (got -p)")

	t.Setenv("FITRANSFER_RAILS", "nope0")
	out, _, code = runCLI("info", "--rails")
	assert.Equal(t, exitFail, code)
	assert.Contains(t, out, `rails: none, a Manager does not open: FITRANSFER_RAILS: tcp;ofi_rxm has no domain "nope0"`)
}

func TestInfoVersion(t *testing.T) {
	want := fiInfo(t, "--version")
	got, _, code := runCLI("info", "--version")
	require.Equal(t, 0, code)
	// Same lines as fi_info but the first (the tool's own version).
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	assert.Equal(t, w[1:3], g[1:3])
	// Then which optional features (1.18+ options, efa-direct) this build
	// has, by the headers it was compiled with: none with 1.17's, all of
	// them with 2.1's.
	compiled := map[string]string{
		"1.17": "none (headers older than 1.18)",
		"2.1": "FI_OPT_EFA_EMULATED_READ/WRITE, FI_OPT_CUDA_API_PERMITTED, FI_OPT_SHARED_MEMORY_PERMITTED, " +
			"FI_OPT_MAX_RMA_SIZE, efa-direct",
	}
	headers := fabric.CompiledVersion().String()
	want, ok := compiled[headers]
	require.True(t, ok, "no expectation for libfabric %s headers: add one", headers)
	assert.Equal(t, "compiled in: "+want, g[4])
}

func TestInfoBadInput(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		contains []string
	}{
		{[]string{"-p", "nosuchprov"}, 2, []string{`unknown provider "nosuchprov"`, "available here:", "tcp", "shm"}},
		{[]string{"-p", "tcp;bogus"}, 2, []string{`unknown provider "bogus"`}},
		{[]string{"-c", "FI_RMA|FI_NOPE"}, 2, []string{`unknown capability "FI_NOPE"`, "FI_MSG", "FI_RMA"}},
		{[]string{"-t", "FI_EP_FOO"}, 2, []string{`unknown endpoint type "FI_EP_FOO"`, "FI_EP_RDM"}},
		{[]string{"-m", "FI_WHAT"}, 2, []string{`unknown mode "FI_WHAT"`, "FI_CONTEXT"}},
		{[]string{"-a", "FI_ADDR_X"}, 2, []string{`unknown address format "FI_ADDR_X"`, "FI_SOCKADDR_IN"}},
		{[]string{"--no-such-flag"}, 2, []string{"flag provided but not defined"}},
		{[]string{"extra"}, 2, []string{`unexpected argument "extra"`}},
		{[]string{"-p", "efa"}, 1, []string{"No data available", "no EFA device"}},
		{[]string{"-p", "psm2", "-t", "FI_EP_RDM"}, 1, []string{"No data available"}},
		{[]string{"-p", "shm", "-t", "FI_EP_MSG"}, 1, []string{"No data available", "no provider matches"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, stderr, code := runCLI(append([]string{"info"}, tt.args...)...)
			assert.Equal(t, tt.code, code, stderr)
			for _, s := range tt.contains {
				assert.Contains(t, stderr, s)
			}
			assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}
}

// TestInfoAnyCombination: for a spread of flag combinations, info exits
// as fi_info does with the same flags (--json aside, which fi_info lacks):
// 0 when fi_info finds something, 1 when it finds nothing (fi_info then
// exits with the errno, FI_ENODATA's 61).
func TestInfoAnyCombination(t *testing.T) {
	path, err := exec.LookPath("fi_info")
	require.NoError(t, err, "fi_info not found: run `make deps` (apt-get install libfabric-bin)")
	flags := [][]string{
		{"-l"}, {"-v"}, {"--json"}, {"-p", "shm"}, {"-t", "FI_EP_MSG"}, {"-c", "FI_TAGGED"},
		{"-n", "localhost"}, {"-s", "127.0.0.1"}, {"-P", "0"}, {"-m", "FI_CONTEXT2"}, {"-a", "FI_ADDR_STR"},
		{"-f", "x"}, {"-d", "lo"},
	}
	exits := map[int]int{}
	for mask := 0; mask < 1<<len(flags); mask += 73 { // a spread of subsets
		var args, theirs []string
		for i, f := range flags {
			if mask&(1<<i) != 0 {
				args = append(args, f...)
				if f[0] != "--json" {
					theirs = append(theirs, f...)
				}
			}
		}
		want := 0
		if err := exec.Command(path, theirs...).Run(); err != nil {
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee, "fi_info %v", theirs)
			require.Equal(t, 61, ee.ExitCode(), "fi_info %v exits with FI_ENODATA or 0", theirs)
			want = 1
		}
		exits[want]++
		_, stderr, code := runCLI(append([]string{"info"}, args...)...)
		assert.Equal(t, want, code, "%v: %s", args, stderr)
	}
	// The spread has both outcomes, or it tests half of what it says.
	assert.Positive(t, exits[0], "combinations fi_info answers")
	assert.Positive(t, exits[1], "combinations fi_info finds nothing for")
}

func TestSamePID(t *testing.T) {
	mine := "    addr_format: FI_ADDR_STR\n    src_addrlen: 14\n    dest_addrlen: 14\n    src_addr: fi_shm://9876\n"
	theirs := "    addr_format: FI_ADDR_STR\n    src_addrlen: 15\n    dest_addrlen: 15\n    src_addr: fi_shm://10234\n"
	assert.Equal(t, samePID(theirs), samePID(mine), "pids of other lengths")
	inet := "    addr_format: FI_SOCKADDR_IN\n    src_addrlen: 16\n"
	assert.Equal(t, inet, samePID(inet), "other address formats keep their lengths")
}
