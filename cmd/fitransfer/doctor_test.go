package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDoctorText(t *testing.T) {
	out, stderr, code := runCLI("doctor")
	require.Equal(t, exitOK, code, stderr+out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.NotEmpty(t, lines)
	assert.True(t, strings.HasPrefix(lines[len(lines)-1], "verdict: transfers can work"), lines[len(lines)-1])
	for _, l := range lines[:len(lines)-1] {
		ok := strings.HasPrefix(l, "pass ") || strings.HasPrefix(l, "warn ") ||
			strings.HasPrefix(l, "fail ") || strings.Contains(l, " fix: ")
		assert.True(t, ok, "unexpected line %q", l)
	}
	assert.Regexp(t, `backend-same-node +(cma|shm)`, out)
}

func TestDoctorJSON(t *testing.T) {
	out, stderr, code := runCLI("doctor", "--json")
	require.Equal(t, exitOK, code, stderr)
	var r struct {
		OK     bool `json:"ok"`
		Routes []struct {
			Locality, Backend, Reason string
		} `json:"routes"`
		Checks []struct{ Name, Status, Detail, Fix string } `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.True(t, r.OK)
	require.Len(t, r.Routes, 2)
	assert.Contains(t, []string{"cma", "shm"}, r.Routes[0].Backend)
	assert.NotEmpty(t, r.Routes[1].Reason)
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
