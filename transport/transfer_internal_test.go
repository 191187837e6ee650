package transport

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/internal/route"
)

// TestCopiesOnly: a request reads no clock only when every op is a
// same-manager or mem copy of one piece at most; a longer copy, a cma op
// (which looks at its limit before its first chunk) or a fabric op needs
// the request's start and deadline.
func TestCopiesOnly(t *testing.T) {
	op := func(k route.Kind, n uint64) opSpec { return opSpec{kind: k, remote: RemoteBuffer{n: n}} }
	cases := []struct {
		name string
		ops  []opSpec
		want bool
	}{
		{"none", nil, true},
		{"mem, one piece", []opSpec{op(route.Mem, route.Piece)}, true},
		{"memcpy and mem", []opSpec{op(route.Memcpy, 8), op(route.Mem, 8)}, true},
		{"mem, a byte over a piece", []opSpec{op(route.Mem, route.Piece+1)}, false},
		{"memcpy, a byte over a piece", []opSpec{op(route.Memcpy, route.Piece+1)}, false},
		{"mem and cma", []opSpec{op(route.Mem, 8), op(route.CMA, 8)}, false},
		{"mem and fabric", []opSpec{op(route.Mem, 8), op(route.Fabric, 8)}, false},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, copiesOnly(c.ops), c.name)
	}
}
