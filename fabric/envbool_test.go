package fabric

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestDeviceRDMASetting: each spelling of FI_EFA_USE_DEVICE_RDMA as
// libfabric 1.17 (strtol into an int) and 1.18+ (fi_parse_bool) read it.
func TestDeviceRDMASetting(t *testing.T) {
	v117, v2 := MakeVersion(1, 17), MakeVersion(2, 1)
	type reading struct{ valid, on bool }
	tests := []struct {
		raw       string
		int117    int32
		v2        reading
		unsetting bool
	}{
		{raw: "1", int117: 1, v2: reading{true, true}},
		{raw: "0", int117: 0, v2: reading{true, false}},
		{raw: "true", int117: 0, v2: reading{true, true}},
		{raw: "TRUE", int117: 0, v2: reading{true, true}},
		{raw: "yes", int117: 0, v2: reading{true, true}},
		{raw: "Yes", int117: 0, v2: reading{true, true}},
		{raw: "on", int117: 0, v2: reading{true, true}},
		{raw: "ON", int117: 0, v2: reading{true, true}},
		{raw: "false", int117: 0, v2: reading{true, false}},
		{raw: "no", int117: 0, v2: reading{true, false}},
		{raw: "off", int117: 0, v2: reading{true, false}},
		{raw: "y", int117: 0, v2: reading{false, false}},
		{raw: "n", int117: 0, v2: reading{false, false}},
		{raw: "2", int117: 2, v2: reading{false, false}},
		{raw: "-1", int117: -1, v2: reading{false, false}},
		{raw: " 1", int117: 1, v2: reading{false, false}},
		{raw: "1 ", int117: 1, v2: reading{false, false}},
		{raw: "\t1", int117: 1, v2: reading{false, false}},
		{raw: "+1", int117: 1, v2: reading{false, false}},
		{raw: "01", int117: 1, v2: reading{false, false}},
		{raw: "08", int117: 0, v2: reading{false, false}},
		{raw: "0x10", int117: 16, v2: reading{false, false}},
		{raw: "0x", int117: 0, v2: reading{false, false}},
		{raw: "1abc", int117: 1, v2: reading{false, false}},
		{raw: "4294967296", int117: 0, v2: reading{false, false}},
		{raw: "4294967297", int117: 1, v2: reading{false, false}},
		{raw: "99999999999999999999", int117: -1, v2: reading{false, false}},
		{raw: "", int117: 0, v2: reading{false, false}},
		{raw: "yeſ", int117: 0, v2: reading{false, false}},
		{unsetting: true},
	}
	for _, tt := range tests {
		name := "unset"
		if !tt.unsetting {
			name = fmt.Sprintf("%q", tt.raw)
		}
		t.Run(name, func(t *testing.T) {
			s := deviceRDMASetting(v117, tt.raw, !tt.unsetting)
			assert.Equal(t, !tt.unsetting, s.Set)
			assert.True(t, s.Integer)
			if !tt.unsetting {
				assert.Equal(t, tt.int117, s.Int, "1.17 strtol(%q)", tt.raw)
				assert.Equal(t, tt.int117 != 0, s.On, "1.17 %q", tt.raw)
			}
			s = deviceRDMASetting(v2, tt.raw, !tt.unsetting)
			assert.False(t, s.Integer)
			if !tt.unsetting {
				assert.Equal(t, tt.v2, reading{s.Valid, s.On}, "2.x fi_parse_bool(%q)", tt.raw)
			}
		})
	}
}

func TestEnvTruthyFollowsParseBool(t *testing.T) {
	for raw, want := range map[string]bool{"1": true, "on": true, "TRUE": true, "y": false, " 1": false, "0": false, "": false} {
		t.Setenv("FI_SHM_DISABLE_CMA", raw)
		assert.Equal(t, want, EnvTruthy("FI_SHM_DISABLE_CMA"), "%q", raw)
	}
}
