// Package endpoint opens fitransfer's RDM endpoints: fabric, domain,
// endpoint, address vector, completion and event queues from one selected
// fi_info; it names the endpoint (fi_getname) and inserts peers
// (fi_av_insert). Memory is registered on its domain by package mr
// (Target).
//
// An Endpoint is driven by one goroutine (the progress loop of package
// progress); its methods are not safe for concurrent use.
package endpoint

import (
	"fmt"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
)

// DefaultDepth bounds the ops in flight when the provider reports no
// tx_attr.size.
const DefaultDepth = 256

// Endpoint is one open RDM endpoint and the resources under it.
type Endpoint struct {
	info   fabric.Info
	fabric *fabric.Fabric
	domain *fabric.Domain
	ep     *fabric.Endpoint
	depth  int
	maxRMA uint64
	peers  map[string]uint64 // endpoint name → fi_addr_t
}

// Open opens fabric, domain and an enabled endpoint for info.
func Open(info *fabric.Info) (*Endpoint, error) {
	e := &Endpoint{info: *info, peers: map[string]uint64{}}
	var err error
	if e.fabric, err = fabric.OpenFabric(info); err != nil {
		return nil, e.wrap(err)
	}
	if e.domain, err = e.fabric.OpenDomain(info); err != nil {
		e.Close()
		return nil, e.wrap(err)
	}
	e.depth = int(info.Tx.Size)
	if e.depth <= 0 || e.depth > 4096 {
		e.depth = min(max(e.depth, DefaultDepth), 4096)
	}
	// The CQ has room for every op in flight: a CQ overrun is fatal on
	// EFA.
	if e.ep, err = e.domain.OpenEndpoint(e.depth, waitsOnTraffic(info), options(info)); err != nil {
		e.Close()
		return nil, e.wrap(err)
	}
	e.maxRMA = info.EP.MaxMsgSize
	if n, err := e.ep.MaxRMASize(); err == nil && n > 0 && (e.maxRMA == 0 || n < e.maxRMA) {
		e.maxRMA = n
	}
	if e.maxRMA == 0 {
		e.maxRMA = 1 << 30
	}
	return e, nil
}

// options are the endpoint options fitransfer sets: efa endpoints get
// FI_OPT_SHARED_MEMORY_PERMITTED false, because fitransfer never sends
// same-node traffic through efa (it has its own cma and shm paths), so
// efa's internal shm path would only hold resources (docs/EFA.md §5).
func options(info *fabric.Info) fabric.EndpointOptions {
	var o fabric.EndpointOptions
	if info.Fabric.ProvName == "efa" {
		no := false
		o.SharedMemoryPermitted = &no
	}
	// shm's CQ has no wait fd, and a peer's RMA completes nothing on the
	// target: the counter is how its loop sees that peers keep it busy.
	o.RemoteCounter = info.Fabric.ProvName == "shm"
	return o
}

// Options reports what the provider answered to the endpoint options
// fitransfer set (nil errors for options it did not set).
func (e *Endpoint) Options() fabric.OptionResults { return e.ep.Options() }

func (e *Endpoint) wrap(err error) error {
	return fmt.Errorf("open %s endpoint (fabric %s, domain %s): %w",
		e.info.Fabric.ProvName, e.info.Fabric.Name, e.info.Domain.Name, err)
}

// Info is the fi_info the endpoint was opened with.
func (e *Endpoint) Info() *fabric.Info { return &e.info }

// Provider is the provider name, e.g. "shm" or "tcp;ofi_rxm".
func (e *Endpoint) Provider() string { return e.info.Fabric.ProvName }

// Name is the endpoint's address (fi_getname) for peers to insert.
func (e *Endpoint) Name() []byte { return e.ep.Name() }

// Depth is how many ops may be in flight: tx_attr.size (bounded), which
// is also the CQ size.
func (e *Endpoint) Depth() int { return e.depth }

// MaxRMA is the largest single RMA op: ep_attr.max_msg_size, lowered by
// FI_OPT_MAX_RMA_SIZE where the provider has it (1.22+).
func (e *Endpoint) MaxRMA() uint64 { return e.maxRMA }

// VirtAddr reports whether remote addresses are virtual addresses
// (FI_MR_VIRT_ADDR) rather than offsets into the registration.
func (e *Endpoint) VirtAddr() bool { return e.info.Domain.MRMode.Has(fabric.MRVirtAddr) }

// Raw is the ofi endpoint, for the progress loop.
func (e *Endpoint) Raw() *fabric.Endpoint { return e.ep }

// Peer returns the fi_addr_t of a peer endpoint name, inserting it into
// the address vector the first time.
func (e *Endpoint) Peer(name []byte) (uint64, error) {
	if a, ok := e.peers[string(name)]; ok {
		return a, nil
	}
	a, err := e.ep.InsertAddr(name)
	if err != nil {
		return 0, fmt.Errorf("%s: insert peer address: %w", e.Provider(), err)
	}
	e.peers[string(name)] = a
	return a, nil
}

// ForgetPeer removes a peer from the address vector; the next Peer call
// inserts it again (a fresh connection on tcp;ofi_rxm).
func (e *Endpoint) ForgetPeer(name []byte) {
	if a, ok := e.peers[string(name)]; ok {
		_ = e.ep.RemoveAddr(a)
		delete(e.peers, string(name))
	}
}

// Target is where memory is registered on this endpoint (mr.Register).
func (e *Endpoint) Target() mr.Target {
	return mr.Target{Provider: e.Provider(), Domain: e.domain, Endpoint: e.ep, Attr: e.info.Domain}
}

// PollEQ returns an asynchronous endpoint error from the event queue, or
// nil.
func (e *Endpoint) PollEQ() *fabric.EQError {
	ev, _ := e.ep.PollEQ()
	return ev
}

// CallsMayNeverReturn reports whether a progress call on the endpoint can
// spin forever: libfabric's shm takes a peer's region lock inside
// fi_read/fi_write and fi_cq_read, and a peer that died holding it never
// releases it — 1.x's for every copy (prov/shm/src/smr_rma.c and
// smr_progress.c, v1.17.0), 2.x's to take and return bounce buffers in
// the target's region (smr_format_sar, smr_get_txbuf,
// smr_progress_resp_entry, v2.1.0), where every initiator toward that
// target, and the target itself, then spins. Only the progress loop's own
// goroutine should make such calls, so that a caller with a deadline is
// never the one caught.
func (e *Endpoint) CallsMayNeverReturn() bool {
	return e.info.Fabric.ProvName == "shm"
}

// UnsafeToCloseInFlight reports whether closing the endpoint while ops are
// in flight can crash the process: libfabric 1.x's tcp;ofi_rxm closes its
// connections on fi_close, the tcp provider flushes a read response it is
// half-way through receiving twice, and rxm dereferences the context of
// the second, freed, entry (rxm_handle_comp_error, prov/rxm/src/rxm_cq.c,
// v1.17.0 — seen here, with a link cut mid-read). 2.x does not.
func (e *Endpoint) UnsafeToCloseInFlight() bool {
	return e.info.Fabric.ProvName == "tcp;ofi_rxm" && fabric.RuntimeVersion().Major() < 2
}

// Abandon gives the endpoint up without closing it: it is never called
// again, and Close leaves it, its domain and fabric to the process's exit.
// With manual progress (fitransfer's domains) the provider does nothing
// on an endpoint nobody progresses.
func (e *Endpoint) Abandon() { e.ep, e.domain, e.fabric = nil, nil, nil }

// Close closes the endpoint, domain and fabric (memory registrations must
// be closed first); closing twice is a no-op.
func (e *Endpoint) Close() {
	if e.ep != nil {
		e.ep.Close()
		e.ep = nil
	}
	if e.domain != nil {
		_ = e.domain.Close()
		e.domain = nil
	}
	if e.fabric != nil {
		_ = e.fabric.Close()
		e.fabric = nil
	}
}

// waitsOnTraffic reports whether a provider's CQ wait object wakes on
// incoming traffic (its sockets are in the wait set), so an idle progress
// loop can block on the CQ's wait fd and still serve peers at once. shm's and
// efa's do not (efa has no CQ wait objects before 2.5): those poll.
func waitsOnTraffic(info *fabric.Info) bool {
	return info.Fabric.ProvName == "tcp;ofi_rxm"
}

// Waitable reports whether the progress loop may block on the CQ's wait fd.
func (e *Endpoint) Waitable() bool { return e.ep.Waitable() }
