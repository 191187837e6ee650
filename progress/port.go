package progress

import (
	"github.com/fitransfer/fitransfer/endpoint"
	"github.com/fitransfer/fitransfer/fabric"
)

// port is what the loop needs of an endpoint and its op queue. The real
// one (endpointPort) calls libfabric; the loop's unit tests drive the same
// logic with a fake queue.
type port interface {
	provider() string
	// set takes op by value: a pointer passed through the interface
	// escapes, which cost an allocation per op posted.
	set(i int, op fabric.Op)
	post(n int) (int, error)
	reap() ([]uint32, error)
	readErr() (fabric.CQError, bool, error)
	// waitable reports whether wait may block until traffic arrives.
	waitable() bool
	// tryWait reports whether the loop may block (fi_trywait), and
	// block waits until traffic, a signal or ms, calling no libfabric
	// function, and reports whether traffic (the CQ's fd) woke it.
	tryWait() (bool, error)
	block(ms int) (bool, error)
	// remoteOps counts peers' RMA ops on this endpoint (0 when it cannot):
	// a target's only sign that peers keep it busy when no wait fd wakes.
	remoteOps() uint64
	hasRemoteOps() bool
	// signal makes a wait in progress return.
	signal()
	pollEQ() *fabric.EQError
	unsafeToCloseInFlight() bool
	// callsMayNeverReturn: only the loop's goroutine calls libfabric.
	callsMayNeverReturn() bool
	abandon()
	// close closes the endpoint, then frees the queue.
	close()
}

// endpointPort is the port of a real endpoint.
type endpointPort struct {
	ep  *endpoint.Endpoint
	raw *fabric.Endpoint
	q   *fabric.Queue
}

func newEndpointPort(ep *endpoint.Endpoint) *endpointPort {
	return &endpointPort{ep: ep, raw: ep.Raw(), q: fabric.NewQueue(postBatch, ep.Depth())}
}

func (p *endpointPort) provider() string                       { return p.ep.Provider() }
func (p *endpointPort) set(i int, op fabric.Op)                { p.q.Set(i, &op) }
func (p *endpointPort) post(n int) (int, error)                { return p.q.Post(p.raw, n) }
func (p *endpointPort) reap() ([]uint32, error)                { return p.q.Reap(p.raw) }
func (p *endpointPort) readErr() (fabric.CQError, bool, error) { return p.q.ReadErr(p.raw) }
func (p *endpointPort) waitable() bool                         { return p.ep.Waitable() }
func (p *endpointPort) tryWait() (bool, error)                 { return p.raw.TryWait() }
func (p *endpointPort) remoteOps() uint64                      { return p.raw.RemoteOps() }
func (p *endpointPort) hasRemoteOps() bool                     { return p.raw.HasRemoteOps() }

// block reports traffic only: a Signal says nothing of the endpoint.
func (p *endpointPort) block(ms int) (bool, error) {
	traffic, _, err := p.raw.Block(ms)
	return traffic, err
}
func (p *endpointPort) signal()                     { p.raw.Signal() }
func (p *endpointPort) pollEQ() *fabric.EQError     { return p.ep.PollEQ() }
func (p *endpointPort) unsafeToCloseInFlight() bool { return p.ep.UnsafeToCloseInFlight() }
func (p *endpointPort) abandon()                    { p.ep.Abandon() }
func (p *endpointPort) callsMayNeverReturn() bool   { return p.ep.CallsMayNeverReturn() }

func (p *endpointPort) close() {
	p.ep.Close()
	p.q.Free()
}
