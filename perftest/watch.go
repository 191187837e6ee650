package perftest

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Marker is the value the last byte of a pingpong buffer takes in
// iteration i: never 0, different from the previous one.
func Marker(i int) byte { return byte(i%255 + 1) }

// WaitByte spins until the last byte of b equals want, as ib_write_lat
// watches its buffer; the peer's RMA write changes it. It reads the byte
// with an atomic load of its aligned word, so the compiler cannot hoist
// the read out of the loop. poll, when set, is called between reads: the
// watcher drives progress (Manager.Poll), as fabtests' pingpong does by
// polling its CQ.
func WaitByte(ctx context.Context, b []byte, want byte, timeout time.Duration, poll func()) error {
	last := unsafe.Pointer(&b[len(b)-1])
	mis := uintptr(last) & 3
	word := (*uint32)(unsafe.Add(last, -int(mis))) // b is page-backed (mr.Alloc): the word is mapped
	shift := 8 * mis
	deadline := time.Now().Add(timeout)
	for i := 0; ; i++ {
		if byte(atomic.LoadUint32(word)>>shift) == want {
			return nil
		}
		if poll != nil {
			poll()
		}
		if i&1023 == 1023 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the peer's write did not arrive within %v", timeout)
			}
			runtime.Gosched()
		}
	}
}
