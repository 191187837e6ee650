package test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// TestRejectedOpKeepsPeer: over tcp;ofi_rxm the owner drops the
// connection when it rejects an op's key (tcpx_op_read_req /
// tcpx_op_write), and rxm posted the next ops on the dead socket for
// 10–30 ms (FI_ENOTCONN). After an op with an altered key and after an op
// on a closed buffer, the very next good op to the same live owner
// succeeds with the right bytes, and the rejected op is ErrStaleHandle
// with a hint that names the rejection, not an exited peer.
func TestRejectedOpKeepsPeer(t *testing.T) {
	const n = 64 << 10
	const prov = "tcp;ofi_rxm"
	m := newManager(t, transport.WithProviders(prov), transport.WithTimeout(10*time.Second))
	owner := testpeer.Start(t, prov)
	good := owner.Register(n, mr.ReadWrite, 1)
	closed := owner.Register(n, mr.ReadWrite, 2)
	local, mem := register(t, m, n, mr.ReadWrite)
	ctx := context.Background()
	require.NoError(t, m.ReadInto(ctx, local, closed), "the buffer works before its owner closes it")
	owner.CloseBuf(1)
	badKey, err := alter(t, good, func(_ map[string]any, eps []map[string]any) {
		for _, e := range eps {
			set(e, "key", num(e["key"])^0xdead)
		}
	})
	require.NoError(t, err)

	seed := uint64(10)
	for _, bad := range []struct {
		name string
		h    transport.RemoteBuffer
	}{{"altered key", badKey}, {"closed buffer", closed}} {
		for _, op := range []string{"read", "write"} {
			t.Run(bad.name+"/"+op, func(t *testing.T) {
				testpeer.Fill(mem, 99)
				err := transfer(ctx, m, op, local, bad.h)
				require.Error(t, err)
				t.Logf("rejected %s: %v", op, err)
				var ce *progress.Error
				require.True(t, errors.As(err, &ce), "a chunk error: %v", err)
				assert.ErrorIs(t, err, transport.ErrStaleHandle, "the owner still listens: it refused the op")
				assert.Contains(t, ce.Hint, "rejects an RMA op's key")
				assert.NotContains(t, err.Error(), "exited")

				seed++
				if op == "write" {
					testpeer.Fill(mem, seed)
					require.NoError(t, m.WriteFrom(ctx, good, local), "the next good write")
					assert.Equal(t, testpeer.Sum(testpeer.Pattern(n, seed)), owner.Sum(0, 0, n), "the owner's bytes")
					owner.FillBuf(0, 1)
					return
				}
				require.NoError(t, m.ReadInto(ctx, local, good), "the next good read")
				assert.Equal(t, testpeer.Sum(testpeer.Pattern(n, 1)), testpeer.Sum(mem), "the bytes read")
			})
		}
	}
}
