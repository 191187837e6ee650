package ofi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBeforeEFAEndpointOnlyForEFA: the hook package fabric sets is asked
// only for the efa RDM fabric; other providers open as before.
func TestBeforeEFAEndpointOnlyForEFA(t *testing.T) {
	var asked []string
	BeforeEFAEndpoint = func(domain string) error { asked = append(asked, domain); return assert.AnError }
	t.Cleanup(func() { BeforeEFAEndpoint = nil })
	s := openSide(t, rmaInfo(t, "shm", 0))
	require.NotNil(t, s.ep)
	assert.Empty(t, asked)
}
