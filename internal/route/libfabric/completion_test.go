package libfabric

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/fabric"
)

// TestWriteFlags: the completion flag each ask gets, provider by
// provider, where it does not depend on shm's single copy.
func TestWriteFlags(t *testing.T) {
	tcp := &Route{Provider: fabric.BackendTCP}
	shm := &Route{Provider: fabric.BackendSHM}
	efa := &Route{Provider: fabric.BackendEFA}
	const (
		delivery = uint64(fabric.OpDeliveryComplete)
		transmit = uint64(fabric.OpTransmitComplete)
		inject   = uint64(fabric.OpInjectComplete)
	)
	for _, tt := range []struct {
		name string
		r    *Route
		want Completion
		flag uint64
	}{
		{"tcp, delivered", tcp, Delivered, delivery},
		{"tcp, transmitted", tcp, Transmitted, transmit},
		{"tcp, source free: no acknowledgement", tcp, SourceFree, inject},
		{"efa, transmitted", efa, Transmitted, transmit},
		{"efa, source free: as delivered", efa, SourceFree, delivery},
		{"shm, transmitted", shm, Transmitted, transmit},
		{"shm unverified, source free: as delivered", shm, SourceFree, delivery},
	} {
		assert.Equal(t, tt.flag, tt.r.WriteFlags(tt.want, false, false), tt.name)
	}
}
