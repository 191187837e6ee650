package perftest

import (
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// release deregisters buf and then frees mem, its memory. When Close
// reports ops still in flight (an interrupted transfer), the memory stays
// allocated: the provider may still read or write it.
func release(buf *transport.Buffer, mem []byte) error {
	if err := buf.Close(); err != nil {
		return err
	}
	return mr.Free(mem)
}
