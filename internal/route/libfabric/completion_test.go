package libfabric

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/fitransfer/fitransfer/fabric"
)

// TestWriteFlags: the completion flag of a write, provider by provider,
// from what its manager (transmit) and its action (source free) asked
// for, where it does not depend on shm's single copy.
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
		name                 string
		r                    *Route
		transmit, sourceFree bool
		flag                 uint64
	}{
		{"tcp", tcp, false, false, delivery},
		{"tcp, transmit", tcp, true, false, transmit},
		{"tcp, source free: no acknowledgement", tcp, false, true, inject},
		{"tcp, transmit and source free", tcp, true, true, inject},
		{"efa, transmit", efa, true, false, transmit},
		{"efa, source free: as without", efa, false, true, delivery},
		{"efa, transmit and source free: as transmit", efa, true, true, transmit},
		{"shm, transmit", shm, true, false, transmit},
		{"shm unverified, source free: as without", shm, false, true, delivery},
		{"shm, transmit and source free: as transmit", shm, true, true, transmit},
	} {
		assert.Equal(t, tt.flag, tt.r.WriteFlags(tt.r.Completion(tt.transmit, tt.sourceFree), false, false), tt.name)
	}
}
