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

// releaseLater is release for a buffer whose transfer failed: Close may
// wait for the ops that transfer left with the provider until the
// manager's timeout, and the failure is reported now, not after that
// wait. The memory is freed when Close allows it.
func releaseLater(buf *transport.Buffer, mem []byte) {
	go func() { _ = release(buf, mem) }()
}
