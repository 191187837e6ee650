package transport

import (
	"context"

	"time"

	"github.com/fitransfer/fitransfer/internal/route/libfabric"
)

// On tcp;ofi_rxm an op that met a connection the owner dropped after
// rejecting another op is posted again (libfabric.Route.RedoAfterDrop);
// the transport builds the repeat, since it cuts ops into chunks.

// resubmit builds the part of o that its finished job old covered again,
// in a new Xfer holding o's local buffer once more, and submits it. It
// fails when the manager or the loop is closing.
func (m *Manager) resubmit(ctx context.Context, o *opSpec, old *libfabric.Xfer, start, deadline time.Time) (*libfabric.Xfer, error) {
	if err := m.acquire(); err != nil {
		return nil, err
	}
	defer m.releaseManager()
	st := old.Local().(*bufState)
	st.hold() // old holds it until it is released: as nextPart's next part
	nx := o.b.NewXfer(st)
	o.sent -= old.Job().Bytes() // fill starts where the finished job started
	if err := m.fill(ctx, nx, o, start, deadline); err != nil {
		nx.Release()
		return nil, err
	}
	if err := nx.Submit(); err != nil {
		nx.Release()
		return nil, err
	}
	return nx, nil
}
