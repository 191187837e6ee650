package perftest

import (
	"time"

	"github.com/fitransfer/fitransfer/mr"
)

// RunMemcpy measures a plain copy between two buffers of this process, of
// each size, as a row next to the routes': the bound the mem route is
// held against. Each size copies iters times (after warmup copies) between
// the same bytes, as every op of a bandwidth window uses the same local
// bytes; window only labels the row.
func RunMemcpy(sizes []uint64, iters, warmup, window int) ([]Row, error) {
	maxSize := uint64(0)
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	src, err := mr.Alloc(int(maxSize))
	if err != nil {
		return nil, err
	}
	defer mr.Free(src)
	dst, err := mr.Alloc(int(maxSize))
	if err != nil {
		return nil, err
	}
	defer mr.Free(dst)
	Fill(src, 1)
	var rows []Row
	for _, size := range sizes {
		n := iters
		if n <= 0 {
			n = DefaultIters(size)
		}
		for i := 0; i < warmup; i++ {
			copy(dst[:size], src[:size])
		}
		lat := make([]time.Duration, n)
		// One clock read a copy, as the transfers' rows read one a window.
		start := monoClock()
		prev := start
		for i := 0; i < n; i++ {
			copy(dst[:size], src[:size])
			now := monoClock()
			lat[i] = now - prev
			prev = now
		}
		row := newRow("copy", "memcpy", size, n, window, prev-start, lat)
		row.Complete = true
		rows = append(rows, row)
	}
	return rows, nil
}
