package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/transport"
)

func TestDoctorText(t *testing.T) {
	t.Setenv("FITRANSFER_RAILS", "")
	out, stderr, code := runCLI("doctor")
	require.Equal(t, exitOK, code, stderr+out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.NotEmpty(t, lines)
	assert.True(t, strings.HasPrefix(lines[len(lines)-1], "verdict: transfers can work"), lines[len(lines)-1])
	// The checks, then the rails section (doctor.Rails.WriteText), then
	// the verdict.
	section := len(lines) - 1
	for i, l := range lines {
		if strings.HasPrefix(l, "rails: ") {
			section = i
			break
		}
	}
	for _, l := range lines[:section] {
		ok := strings.HasPrefix(l, "pass ") || strings.HasPrefix(l, "warn ") ||
			strings.HasPrefix(l, "fail ") || strings.Contains(l, " fix: ")
		assert.True(t, ok, "unexpected line %q", l)
	}
	require.Less(t, section, len(lines)-1, "no rails section")
	for _, l := range lines[section+1 : len(lines)-1] {
		assert.True(t, strings.HasPrefix(l, "  ") || strings.HasPrefix(l, "memory → NIC: "), "unexpected line %q", l)
	}
	assert.Regexp(t, `backend-same-node +`+sameNodeBackend()+` `, out)
	// No EFA here: tcp;ofi_rxm's one rail, without a PCI address.
	assert.Regexp(t, `(?m)^rails: 1 of tcp;ofi_rxm \(`, out)
	assert.Contains(t, out, "fi_info gives no PCI address")
}

// TestDoctorWhenNoManagerOpens: libfabric lists its providers, and none
// of them opens (FI_HOOK=debug refuses every completion queue, 1.17 and
// 2.1; libfabric reads it once a process: in a child). doctor said
// "transfers can work" (a new user's review); it must fail, saying what
// failed and how to find the cause.
func TestDoctorWhenNoManagerOpens(t *testing.T) {
	cmd := cliCommand(t, "doctor")
	cmd.Env = append(cmd.Env, "FI_HOOK=debug", "FITRANSFER_RAILS=")
	out, err := cmd.Output()
	require.Error(t, err, string(out))
	assert.Regexp(t, `(?m)^fail  manager-open +open \S+ endpoint .*fi_cq_open: Invalid argument`, string(out))
	assert.Contains(t, string(out), "fix: a provider libfabric lists does not open here")
	assert.Regexp(t, `(?m)^verdict: no transfer can work: a Manager does not open`, string(out))
}

func TestDoctorJSON(t *testing.T) {
	t.Setenv("FITRANSFER_RAILS", "")
	out, stderr, code := runCLI("doctor", "--json")
	require.Equal(t, exitOK, code, stderr)
	var r struct {
		OK     bool `json:"ok"`
		Routes []struct {
			Locality, Backend, Reason string
		} `json:"routes"`
		Checks []struct{ Name, Status, Detail, Fix string } `json:"checks"`
		Rails  struct {
			Provider string
			Rails    []struct{ Rail int }
			Note     string
		} `json:"rails"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.True(t, r.OK)
	require.Len(t, r.Routes, 2)
	assert.Equal(t, sameNodeBackend(), r.Routes[0].Backend)
	assert.NotEmpty(t, r.Routes[1].Reason)
	assert.Equal(t, "tcp;ofi_rxm", r.Rails.Provider)
	assert.Len(t, r.Rails.Rails, 1)
	assert.Contains(t, r.Rails.Note, "no PCI address")
}

func TestDoctorBadRails(t *testing.T) {
	t.Setenv("FITRANSFER_RAILS", "nope0")
	out, _, code := runCLI("doctor")
	assert.Equal(t, exitFail, code)
	assert.Regexp(t, `(?m)^fail +rails +FITRANSFER_RAILS: tcp;ofi_rxm has no domain "nope0"`, out)
	assert.Contains(t, out, "verdict: no transfer can work: a Manager does not open")
}

func TestDoctorBadFlag(t *testing.T) {
	_, stderr, code := runCLI("doctor", "--bogus")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, "flag provided but not defined: -bogus")
	assert.Equal(t, 1, strings.Count(stderr, "\n"))
}

func TestUnknownCommand(t *testing.T) {
	_, stderr, code := runCLI("frobnicate")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, stderr, `unknown command "frobnicate"`)
	assert.Contains(t, stderr, "info, doctor")
}

// sameNodeBackend is the same-node route a manager here uses first toward
// a verified owner: mem where it shares memory, else cma where
// process_vm_* reaches its peers, else shm.
func sameNodeBackend() string {
	if ok, _ := transport.MemAvailable(); ok {
		return "mem"
	}
	if ok, _ := transport.CMAAvailable(); ok {
		return "cma"
	}
	return "shm"
}
