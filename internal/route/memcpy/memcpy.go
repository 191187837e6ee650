// Package memcpy is the route to buffers of managers of this process: a
// copy, checked against the owner's own record of the buffer by the
// transport before it runs.
package memcpy

import (
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/progress"
)

// Name is the route's name in errors and Route.
const Name = "memcpy"

// Route is the memcpy route. It holds nothing.
type Route struct{}

var _ route.Route = Route{}

// Kind is route.Memcpy.
func (Route) Kind() route.Kind { return route.Memcpy }

// Name is "memcpy".
func (Route) Name() string { return Name }

// Wedged is nil: a copy cannot wedge.
func (Route) Wedged() error { return nil }

// Close is a no-op.
func (Route) Close() error { return nil }

// Copy runs one op between local and target, the owner's bytes, in
// pieces, looking at the limit in between: a read copies target into
// local, a write local into target.
func Copy(lim route.Limit, op progress.Op, local, target []byte) error {
	dst, src := local, target
	if op == progress.Write {
		dst, src = target, local
	}
	n := uint64(len(dst))
	for off := uint64(0); off < n; off += route.Piece {
		if off > 0 {
			if err := lim.Err(); err != nil {
				return lim.Timeout(op, Name, "this manager", n, off, route.Piece, err)
			}
		}
		end := min(off+route.Piece, n)
		copy(dst[off:end], src[off:end])
	}
	return nil
}
