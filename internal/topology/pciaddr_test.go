package topology

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func addr(t *testing.T, s string) PCIAddr {
	t.Helper()
	a, err := ParsePCIAddr(s)
	require.NoError(t, err)
	return a
}

func addrs(t *testing.T, ss ...string) []PCIAddr {
	t.Helper()
	out := make([]PCIAddr, len(ss))
	for i, s := range ss {
		out[i] = addr(t, s)
	}
	return out
}

func TestParsePCIAddr(t *testing.T) {
	for _, c := range []struct {
		in   string
		want PCIAddr
		out  string // String of the result; "" when in must not parse
	}{
		{"0000:10:1b.0", PCIAddr{0, 0x10, 0x1b, 0}, "0000:10:1b.0"},
		{"0000:a0:1d.0", PCIAddr{0, 0xa0, 0x1d, 0}, "0000:a0:1d.0"},
		{"0000:CA:00.0", PCIAddr{0, 0xca, 0, 0}, "0000:ca:00.0"}, // nvidia-smi writes upper case
		{"ffff:ff:1f.7", PCIAddr{0xffff, 0xff, 0x1f, 7}, "ffff:ff:1f.7"},
		{in: ""},
		{in: "0000:10:1b"},       // no function
		{in: "10:1b.0"},          // no domain
		{in: "00000000:53:00.0"}, // nvidia-smi's 8-digit domain
		{in: "10000:e0:1d.0"},    // VMD domain, beyond fi_pci_attr's uint16
		{in: "0000:10:20.0"},     // device 32
		{in: "0000:10:1b.8"},     // function 8
		{in: "0000:1g:1b.0"},
		{in: "0000:+1:1b.0"},
		{in: " 0000:10:1b.0"},
		{in: "0000:10:1b.0\n"},
		{in: "pci0000:00"},
	} {
		t.Run(c.in, func(t *testing.T) {
			a, err := ParsePCIAddr(c.in)
			if c.out == "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), strconv.Quote(c.in))
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, a)
			assert.Equal(t, c.out, a.String())
			back, err := ParsePCIAddr(a.String())
			require.NoError(t, err)
			assert.Equal(t, a, back)
			j, err := json.Marshal(a)
			require.NoError(t, err)
			assert.Equal(t, `"`+c.out+`"`, string(j))
			var u PCIAddr
			require.NoError(t, json.Unmarshal(j, &u))
			assert.Equal(t, a, u)
		})
	}
}
