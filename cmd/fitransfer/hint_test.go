package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
)

func TestHintCommand(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		stdout   []string
		stderr   []string
		rowCount int
	}{
		{[]string{"-p", "efa", "15"}, 0, []string{"efa prov_errno 15: EFA_IO_COMP_STATUS_LOCAL_ERROR_UNREACH_REMOTE", "self-referencing"}, nil, 1},
		{[]string{"-p", "efa", "--", "-4111"}, 0, []string{"FI_EFA_ERR_RMA_ADDR", "fresh, correct handle"}, nil, 1},
		{[]string{"113"}, 0, []string{"fi_errno 113: FI_EHOSTUNREACH", "firewall"}, nil, 1},
		{[]string{"fi_ecanceled", "FI_ETRUNC"}, 0, []string{"FI_ECANCELED", "FI_ETRUNC"}, nil, 2},
		{[]string{"-p", "efa", "17"}, 1, nil, []string{"no hint for efa prov_errno 17", "--list"}, 0},
		{[]string{"-p", "shm", "15"}, 1, nil, []string{`no prov_errno table for provider "shm"`}, 0},
		{[]string{"99"}, 1, nil, []string{"no hint for fi_errno 99", "FI_EADDRNOTAVAIL"}, 0},
		{[]string{"FI_NOPE"}, 1, nil, []string{`no hint for "FI_NOPE"`}, 0},
		{[]string{}, 2, nil, []string{"name an error number"}, 0},
		{[]string{"--bogus"}, 2, nil, []string{"flag provided but not defined"}, 0},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			out, stderr, code := runCLI(append([]string{"hint"}, tt.args...)...)
			assert.Equal(t, tt.code, code, stderr)
			for _, s := range tt.stdout {
				assert.Contains(t, out, s)
			}
			for _, s := range tt.stderr {
				assert.Contains(t, stderr, s)
			}
			assert.Equal(t, tt.rowCount, strings.Count(out, "  fix: "))
			if code != 0 {
				assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			}
		})
	}
}

func TestHintListJSON(t *testing.T) {
	out, stderr, code := runCLI("hint", "--list", "--json")
	require.Equal(t, 0, code, stderr)
	var rows []hintJSON
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	assert.Len(t, rows, len(fabric.HintTable()))
	for _, r := range rows {
		assert.NotEmpty(t, r.Name)
		assert.NotEmpty(t, r.Meaning)
		assert.NotEmpty(t, r.Fix)
		assert.True(t, (r.Provider == "efa") == (r.ProvErrno != 0), "%+v", r)
	}
}
