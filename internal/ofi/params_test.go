package ofi

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParamsReadTheEnvironmentNow(t *testing.T) {
	// Core variables every libfabric defines; set after libfabric was
	// initialized, they must still show, and set-but-empty apart from unset.
	t.Setenv("FI_LOG_INTERVAL", "2000")
	t.Setenv("FI_LOG_SUBSYS", "")
	t.Setenv("FI_LOG_PROV", "") // restored after the test
	require.NoError(t, os.Unsetenv("FI_LOG_PROV"))
	params, err := Params()
	require.NoError(t, err)
	got := map[string]Param{}
	for _, p := range params {
		got[p.Name] = p
	}
	want := map[string]Param{
		"FI_LOG_INTERVAL": {Name: "FI_LOG_INTERVAL", Type: ParamInt, Help: got["FI_LOG_INTERVAL"].Help, Value: "2000", Set: true},
		"FI_LOG_SUBSYS":   {Name: "FI_LOG_SUBSYS", Type: ParamString, Help: got["FI_LOG_SUBSYS"].Help, Value: "", Set: true},
		"FI_LOG_PROV":     {Name: "FI_LOG_PROV", Type: ParamString, Help: got["FI_LOG_PROV"].Help},
	}
	for name, p := range want {
		assert.Equal(t, p, got[name], name)
		assert.NotEmpty(t, got[name].Help, name)
	}
}
