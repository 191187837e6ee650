// Package libfabric is the route over a libfabric endpoint: shm,
// tcp;ofi_rxm, efa — one implementation, the provider is data. A Route is
// one open endpoint, its progress loop (package progress), the peers in
// its address vector, and the workarounds its providers need: shm's
// dead-peer bookkeeping and write flags, the tcp liveness probe, the
// scratch memory shm handle checks read into.
//
// The transport cuts requests into chunks and hands them to a Route as
// Xfers (one job of chunks toward one peer); the Route posts them and
// reports how they ended.
package libfabric

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/fitransfer/fitransfer/endpoint"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// MaxNameLen bounds an endpoint name from a peer (the handle format's
// limit, docs/handle.md).
const MaxNameLen = 1024

// Route is one open libfabric endpoint of a manager and its progress
// loop.
type Route struct {
	Index    int            // its index among the manager's routes: MRs are kept per index
	Provider fabric.Backend // "shm", "tcp;ofi_rxm", "efa", "efa-direct"
	Info     fabric.Info
	Reason   string // why it was chosen
	Role     string // "same node", "remote", or "forced"
	VirtAddr bool   // remote addresses are virtual addresses (FI_MR_VIRT_ADDR)
	Chunk    uint64 // largest op
	// Scratch is where shm handle checks land; nil on other providers
	// and before RegisterScratch.
	Scratch *Scratch
	// Retired: another endpoint took its place, because it is stuck
	// inside libfabric, or (an Outgoing one, Retire) it took its share
	// of peers or is blocked behind a dead one; no new op picks it.
	Retired atomic.Bool
	// Rail is its place among the manager's rails (the domains of the
	// remote provider it stripes over); 0 on other routes.
	Rail int
	// Outgoing: an shm endpoint only for this manager's own ops, which
	// no handle names (the transport's shm rotation, see RecyclesSlots):
	// it holds no registration peers reach, and is retired once it took
	// its share of peers.
	Outgoing bool

	loop *progress.Loop
	name []byte // endpoint name, immutable

	// sentTo: the processes a post of this endpoint's ops reached shm
	// for, on 1.x (noteSent), whom its close waits for (awaitPeersMapping).
	// Apart from peers, which Forget clears, and under a lock of its own:
	// mu may be held across an fi_av_insert.
	sentTo pidSet

	mu    sync.Mutex
	peers map[string]*Peer // endpoint name → address
	// retiring, onDrained: see Retire.
	retiring  bool
	onDrained func()
	// pending: names Admit counted that are not inserted yet.
	pending map[string]bool
	added   map[string]int // AddPeer calls not yet undone, per name
	// unmapped: on libfabric 1.x, shm names whose region went while they
	// were inserted (PeerBy); never inserted again.
	unmapped map[string]bool

	recycles     bool // RecyclesSlots
	scratchFreed atomic.Bool
	inserts      atomic.Int64    // see MapAdds
	left         map[string]bool // see LeaveSlots; under mu
	// holds counts Hold; drainedHolds once the route drained (Retire).
	holds atomic.Int64

	// shm: ops still in flight to peers that died (see Blocked).
	deadOps   atomic.Int32
	deadSince atomic.Int64  // unix nanoseconds of the first
	deadRound atomic.Uint64 // the loop's Rounds then
	deadPeer  atomic.Pointer[string]
	// stranded: shm jobs finished with ops in flight (xferStranded);
	// strandChecked: the last checkStranded. Under the drive lock.
	stranded      map[*Xfer]*strandWatch
	strandChecked time.Time

	// own: this endpoint's region, where removePeer clears the
	// handshakes removed peers leave (1.x's shm); on the loop only.
	own     ownRegion
	cleared atomic.Int64 // see HandshakesCleared
}

// Open opens an endpoint for info and starts its progress loop. chunkCap,
// when not 0, lowers the largest op below the provider's.
func Open(index int, info *fabric.Info, reason, role string, policy progress.PollPolicy, log zerolog.Logger, chunkCap uint64) (*Route, error) {
	ep, err := endpoint.Open(info)
	if err != nil {
		return nil, err
	}
	chunk := ep.MaxRMA()
	if chunkCap > 0 && chunkCap < chunk {
		chunk = chunkCap
	}
	provider := fabric.Backend(Name(ep.Info()))
	return &Route{
		Index: index, Provider: provider, Info: *ep.Info(), Reason: reason, Role: role,
		loop: progress.Start(ep, policy, log), name: append([]byte(nil), ep.Name()...), VirtAddr: ep.VirtAddr(),
		Chunk: chunk, peers: map[string]*Peer{}, recycles: recyclesSlots(provider),
	}, nil
}

// Name names a route in handles: the provider, except that efa's
// efa-direct fabric (not interoperable with efa's RDM protocol) is
// "efa-direct".
func Name(in *fabric.Info) string {
	if in.Fabric.ProvName == "efa" && in.Fabric.Name == "efa-direct" {
		return string(fabric.BackendEFADirect)
	}
	return in.Fabric.ProvName
}

// Kind is route.Fabric.
func (r *Route) Kind() route.Kind { return route.Fabric }

// Name is the provider.
func (r *Route) Name() string { return string(r.Provider) }

// EndpointName is this endpoint's address, for peers to insert.
func (r *Route) EndpointName() []byte { return r.name }

// Address is the endpoint's address, printable.
func (r *Route) Address() string { return r.Addr(r.name) }

// Addr prints an endpoint name of this route's address format.
func (r *Route) Addr(name []byte) string {
	return fabric.Addr{Format: r.Info.AddrFormat, Bytes: name}.String()
}

// Wedged is a *progress.WedgedError while a libfabric call on the
// endpoint has not returned for the policy's WedgeAfter.
func (r *Route) Wedged() error { return r.loop.Wedged() }

// Activity counts the ops posted and completed on the endpoint so far.
func (r *Route) Activity() (posted, completed uint64) { return r.loop.Activity() }

// PollIfWanted polls the route if a caller spinning on memory should now
// (progress.Loop.PollIfWanted).
func (r *Route) PollIfWanted() { r.loop.PollIfWanted() }

// ParkWhenUnattended lets the idle progress loop stop polling while no
// peer attends (progress.Loop.ParkWhenUnattended): for an endpoint that
// peers reach only after announcing themselves.
func (r *Route) ParkWhenUnattended() { r.loop.ParkWhenUnattended() }

// ServesNoPeers tells the progress loop that no peer's op needs this
// endpoint's progress (progress.Loop.ServesNoPeers): for an endpoint no
// handle names.
func (r *Route) ServesNoPeers() { r.loop.ServesNoPeers() }

// Nudge makes the progress loop look now (progress.Loop.Nudge).
func (r *Route) Nudge() { r.loop.Nudge() }

// Parked reports whether the progress loop waits for work without
// polling (progress.Loop.Parked).
func (r *Route) Parked() bool { return r.loop.Parked() }

// Rounds is how many rounds of progress the endpoint's loop ran, to
// within 16 (progress.Loop.Rounds).
func (r *Route) Rounds() uint64 { return r.loop.Rounds() }

// Polls is how many times callers polled the endpoint (progress.Loop.Polls).
func (r *Route) Polls() uint64 { return r.loop.Polls() }

// Attend keeps the progress loop polling for a peer that may need it,
// until release is called (progress.Loop.Attend).
func (r *Route) Attend() (release func()) { return r.loop.Attend() }

// Attending is how many peers attend the endpoint (Attend).
func (r *Route) Attending() int { return r.loop.Attending() }

// Wake makes the idle progress loop look now and for its Spin: a peer's
// op that needs this endpoint's progress is on its way (progress.Loop.Wake).
func (r *Route) Wake() { r.loop.Wake() }

// Do runs fn with the endpoint to itself (memory registration and
// deregistration go there).
func (r *Route) Do(fn func()) error { return r.loop.Do(fn) }

// DoBy is Do for a request that ends with ctx or at deadline
// (progress.Loop.DoBy).
func (r *Route) DoBy(ctx context.Context, deadline time.Time, fn func()) error {
	return r.loop.DoBy(ctx, deadline, fn)
}

// Register registers reg on the endpoint's domain.
func (r *Route) Register(reg mr.Region) (*fabric.MR, error) {
	return r.RegisterBy(context.Background(), time.Time{}, reg)
}

// RegisterBy is Register for a request that ends with ctx or at deadline
// (none when zero): while a libfabric call holds the endpoint past then,
// it gives up with a *progress.TimeoutError whose Busy is set
// (progress.Loop.DoBy).
func (r *Route) RegisterBy(ctx context.Context, deadline time.Time, reg mr.Region) (*fabric.MR, error) {
	var m *fabric.MR
	var err error
	if derr := r.loop.DoBy(ctx, deadline, func() { m, err = mr.Register(r.loop.Endpoint().Target(), reg) }); derr != nil {
		return nil, derr
	}
	return m, err
}

var _ route.Route = (*Route)(nil)

// Close is CloseWith(nil).
func (r *Route) Close() error { return r.CloseWith(nil) }

// CloseWith fails the route's unfinished jobs, runs beforeEndpointClose
// with the endpoint to itself (MRs must close before their endpoint),
// closes the endpoint and stops the loop. It returns the
// *progress.WedgedError of an endpoint stuck inside libfabric, which it
// leaves behind.
func (r *Route) CloseWith(beforeEndpointClose func()) error {
	var stopped func(progress func() bool)
	if r.AwaitsPeersMapping() {
		// Once the loop failed its jobs: no command of this endpoint's
		// goes out to a peer after the wait.
		stopped = func(progress func() bool) {
			r.awaitPeersMapping(time.Now().Add(peersMappingWait), progress)
		}
	}
	return r.loop.CloseAfter(stopped, peersMappingWait, func() {
		if beforeEndpointClose != nil {
			beforeEndpointClose()
		}
		if r.Scratch != nil {
			r.Scratch.closeMRs()
		}
		r.own.unmap()
	})
}

// peersMappingWait bounds how long a closing 1.x shm endpoint waits for
// its peers to map its region (awaitPeersMapping): a peer that progresses
// at all does so within milliseconds.
const peersMappingWait = 500 * time.Millisecond

// Closing reports whether the route's Close began.
func (r *Route) Closing() bool { return r.loop.Closing() }

// AwaitStop waits for the loop, whose Close began elsewhere, to stop:
// nil once it did, or the *progress.WedgedError of an endpoint left
// behind (progress.Loop.AwaitStop).
func (r *Route) AwaitStop() error { return r.loop.AwaitStop() }

// Stopped reports whether the loop stopped (and so the endpoint is
// closed): false after Close of a wedged endpoint.
func (r *Route) Stopped() bool { return r.loop.Stopped() }

// FreeScratch frees the scratch memory once the loop stopped; only the
// first call that finds it stopped does.
func (r *Route) FreeScratch() {
	if r.Scratch != nil && r.loop.Stopped() && r.scratchFreed.CompareAndSwap(false, true) {
		_ = mr.Free(r.Scratch.mem)
	}
}

// Wait waits for x's job: when it returns nil, the job finished (its
// Errs say how); a *progress.WedgedError leaves the job to the loop.
func (r *Route) Wait(ctx context.Context, x *Xfer) error { return r.loop.Wait(ctx, x.job) }

// CheckName refuses an endpoint name a provider would misread: libfabric
// takes a name by its pointer alone and reads as many bytes as its
// address format implies.
func (r *Route) CheckName(name []byte) error {
	want := len(r.name) // the format's size: this endpoint's own name
	switch r.Info.AddrFormat {
	case fabric.AddrSockaddrIn:
		want = 16
	case fabric.AddrSockaddrIn6:
		want = 28
	case fabric.AddrSockaddr:
		want = 16
		if len(name) >= 2 && binary.LittleEndian.Uint16(name) == syscall.AF_INET6 {
			want = 28
		}
	}
	if r.Provider == fabric.BackendSHM {
		want = len(name) // shm names come from a verified owner (the transport's same-node check)
	}
	if len(name) != want || len(name) > MaxNameLen {
		return fmt.Errorf("%w: a %s endpoint address of %d bytes (%v takes %d)", errclass.ErrBadHandle, r.Provider, len(name), r.Info.AddrFormat, want)
	}
	switch r.Info.AddrFormat {
	case fabric.AddrSockaddrIn, fabric.AddrSockaddrIn6, fabric.AddrSockaddr:
		if err := checkSockaddr(name); err != nil {
			return fmt.Errorf("%w: a %s endpoint address: %v", errclass.ErrBadHandle, r.Provider, err)
		}
	}
	return nil
}

// OtherFamily reports whether name is a well-formed socket address of
// the other IP family than this endpoint's (an IPv6 peer of an IPv4
// endpoint, or the reverse): no fault of the name, and no peer this
// endpoint can reach or be reached from either.
func (r *Route) OtherFamily(name []byte) bool {
	var family uint16
	switch r.Info.AddrFormat {
	case fabric.AddrSockaddrIn:
		family = syscall.AF_INET6
	case fabric.AddrSockaddrIn6:
		family = syscall.AF_INET
	default:
		return false
	}
	return len(name) >= 2 && binary.LittleEndian.Uint16(name) == family && checkSockaddr(name) == nil
}

// Family is this endpoint's IP family, "IPv4" or "IPv6", or "" when its
// addresses are not IP addresses.
func (r *Route) Family() string {
	switch r.Info.AddrFormat {
	case fabric.AddrSockaddrIn:
		return "IPv4"
	case fabric.AddrSockaddrIn6:
		return "IPv6"
	}
	return ""
}

// checkSockaddr refuses a socket address of the length its family takes
// that no endpoint can have: another family than AF_INET (16 bytes) or
// AF_INET6 (28), port 0, or an IP that is unspecified, broadcast or
// multicast. libfabric's tcp took a 16-byte AF_UNIX address, failed to
// insert it, and failed every later insert into that address vector (an
// attacker's review, 1.17 and 2.1).
func checkSockaddr(b []byte) error {
	family := binary.LittleEndian.Uint16(b)
	var ip net.IP
	switch {
	case family == syscall.AF_INET && len(b) == 16:
		ip = net.IP(b[4:8])
	case family == syscall.AF_INET6 && len(b) == 28:
		ip = net.IP(b[8:24])
	default:
		return fmt.Errorf("address family %d in %d bytes (AF_INET takes 16, AF_INET6 28)", family, len(b))
	}
	switch port := binary.BigEndian.Uint16(b[2:4]); {
	case port == 0:
		return errors.New("port 0")
	case ip.IsUnspecified(), ip.Equal(net.IPv4bcast), ip.IsMulticast():
		return fmt.Errorf("IP %v, which no endpoint has", ip)
	}
	return nil
}

// Peer is a peer endpoint in the address vector.
type Peer struct {
	addr uint64 // fi_addr_t
	raw  []byte // its endpoint name
	name string // printable
	drop *drop  // tcp: its last dropped connection
	uses atomic.Int32
	// forget: Forget found p in use; the last use's Done forgets it.
	forget atomic.Bool
	// sent: a post of an op of this endpoint toward p reached the
	// provider (noteSent).
	sent atomic.Bool
	r    *Route
}

// Name is the peer's address, printable.
func (p *Peer) Name() string { return p.name }

// Done ends a use of p (see Route.Peer). The last use of a peer that
// Forget found in use forgets it, on a goroutine of its own: Done may run
// inside the loop (an Xfer that went idle), where Forget's Do would wait
// for itself.
func (p *Peer) Done() {
	if p.uses.Add(-1) == 0 {
		switch {
		case p.forget.Load():
			go p.r.forget(p.raw, p)
		case p.r.Retired.Load():
			go p.r.maybeDrained() // its last use may have been the route's (Retire)
		}
	}
}

// Peer returns a peer endpoint, inserting it into the address vector (on
// the loop goroutine) the first time. It counts a use of it: the caller
// hands it back with Done, or an Xfer that took it does when idle.
func (r *Route) Peer(name []byte) (*Peer, error) {
	return r.PeerBy(context.Background(), time.Time{}, name)
}

// PeerBy is Peer for a request that ends with ctx or at deadline (none
// when zero): while a libfabric call holds the endpoint past then, the
// first use of name gives up with a *progress.TimeoutError whose Busy is
// set (progress.Loop.DoBy).
func (r *Route) PeerBy(ctx context.Context, deadline time.Time, name []byte) (*Peer, error) {
	r.mu.Lock()
	p := r.peers[string(name)]
	if p != nil {
		p.uses.Add(1)
	}
	unmapped := r.unmapped[string(name)]
	r.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if unmapped {
		return nil, shmNameSpent(name)
	}
	if err := r.CheckName(name); err != nil {
		return nil, err
	}
	var err error
	if derr := r.loop.DoBy(ctx, deadline, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if p = r.peers[string(name)]; p != nil {
			p.uses.Add(1)
			return
		}
		if r.unmapped[string(name)] {
			err = shmNameSpent(name)
			return
		}
		shm := r.Provider == fabric.BackendSHM
		if shm && !shmRegionExists(name) {
			// Not inserted at all: shm would take it with no region (see
			// shmRegionExists).
			err = r.shmRegionGone(name)
			return
		}
		var addr uint64
		switch {
		case r.pending[string(name)]:
			delete(r.pending, string(name)) // Admit counted it
		case r.recycles && r.inserts.Load() >= mapAddsMax:
			err = r.mapFull(name)
			return
		default:
			r.inserts.Add(1) // shm's map may take a slot even for an insert that fails
		}
		r.sweepRemovals(name)
		if addr, err = r.loop.Endpoint().Peer(name); err != nil {
			return
		}
		if shm && !shmRegionExists(name) {
			// The region went during the insert. Removed again; on 1.x
			// the removal keeps the name in shm's map, in a slot the
			// next insert takes: never inserted again.
			r.removePeer(name)
			if fabric.RuntimeVersion().Major() == 1 {
				if r.unmapped == nil {
					r.unmapped = map[string]bool{}
				}
				r.unmapped[string(name)] = true
			}
			err = r.shmRegionGone(name)
			return
		}
		raw := append([]byte(nil), name...)
		p = &Peer{addr: addr, raw: raw, name: r.Addr(raw), drop: new(drop), r: r}
		p.uses.Add(1)
		r.peers[string(name)] = p
	}); derr != nil {
		return nil, derr
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Forget removes a peer from the address vector (which releases what the
// provider holds for it: shm's mapping of its region, rxm's connection).
// A peer an Xfer holds is removed when its last use ends (an op posted to
// a removed address crashes libfabric); one a session added (Add) stays
// until its last Unadd. Insertion and removal both happen inside the
// loop's Do, so a peer found in the map is always inserted.
func (r *Route) Forget(name []byte) { r.forget(name, nil) }

// forget is Forget of name; with only set, of that peer only: a later
// peer of the same name is another's to forget.
func (r *Route) forget(name []byte, only *Peer) {
	_ = r.loop.Do(func() {
		r.mu.Lock()
		p := r.peers[string(name)]
		if p == nil || only != nil && p != only || r.added[string(name)] > 0 {
			r.mu.Unlock()
			return
		}
		// The mark before the look at the uses: a Done between the two
		// sees the mark and forgets the peer itself.
		p.forget.Store(true)
		if p.uses.Load() > 0 {
			r.mu.Unlock()
			return
		}
		delete(r.peers, string(name))
		r.mu.Unlock()
		r.removePeer(name)
		r.maybeDrained()
	})
}

// Add records one AddPeer of name, after Peer inserted it.
func (r *Route) Add(name []byte) {
	r.mu.Lock()
	if r.added == nil {
		r.added = map[string]int{}
	}
	r.added[string(name)]++
	if p := r.peers[string(name)]; p != nil {
		p.forget.Store(false) // a Forget while it was in use is undone
	}
	r.mu.Unlock()
}

// Unadd undoes one Add of name; the last one forgets the peer. A name
// never added is left alone: it may be another session's peer.
func (r *Route) Unadd(name []byte) {
	r.mu.Lock()
	n, ok := r.added[string(name)]
	if ok && n > 1 {
		r.added[string(name)] = n - 1
	} else {
		delete(r.added, string(name))
	}
	r.mu.Unlock()
	if ok && n == 1 {
		r.Forget(name)
	}
}

// blockedGrace and blockedRounds are how long, and for how many rounds of
// the progress loop, ops to a dead shm peer may stay in flight before the
// endpoint counts as blocked: completions already written but not yet
// read drain well within both. The rounds keep a loaded machine, whose
// loop gets little CPU, from taking late completions for none.
const (
	blockedGrace  = 200 * time.Millisecond
	blockedRounds = 256
)

// abandonDead records ops left in flight to an shm peer that will never
// answer them: it died, its endpoint closed, or (2.x) its owner dropped
// them with a closed buffer (checkStranded).
func (r *Route) abandonDead(peer string) {
	if r.deadOps.Add(1) == 1 {
		r.deadPeer.Store(&peer)
		r.deadRound.Store(r.loop.Rounds())
		r.deadSince.Store(time.Now().UnixNano())
	}
}

// Blocked returns an error wrapping errclass.ErrBlocked when ops to a dead
// peer have stayed in flight past blockedGrace. libfabric's shm takes an
// endpoint's completions from one queue in order (smr_progress_resp,
// prov/shm/src/smr_progress.c, v1.17.0 and v2.1.0): an op whose target
// died is never answered, and no later op on the endpoint completes
// either, whatever its peer. Failing at once beats a timeout per op.
func (r *Route) Blocked() error {
	if r.deadOps.Load() == 0 {
		return nil
	}
	since := time.Duration(time.Now().UnixNano() - r.deadSince.Load())
	if since < blockedGrace || r.loop.Rounds()-r.deadRound.Load() < blockedRounds {
		return nil
	}
	peer := "a peer"
	if p := r.deadPeer.Load(); p != nil {
		peer = *p
	}
	what := fmt.Sprintf("the %s endpoint can complete no more ops: %s left ops in flight unanswered for good %v ago (its process exited, its endpoint closed, or its owner dropped them with a closed buffer), "+
		"and shm completes an endpoint's ops in order, so later ops would wait forever", r.Provider, peer, since.Round(time.Millisecond))
	if r.Outgoing {
		return fmt.Errorf("%w: %s; %w", errclass.ErrBlocked, what, errclass.ErrRouteReplaced)
	}
	return fmt.Errorf("%w: %s; close the manager and open a new one (fitransfer's default same-node path, cma, keeps no such state)",
		errclass.ErrBlocked, what)
}

// Abandoned reports whether ops to a peer that died are in flight on the
// endpoint (see Blocked), which later ops may wait behind.
func (r *Route) Abandoned() bool { return r.deadOps.Load() > 0 }

// BlockedOrGone is Blocked for an op toward the shm endpoint name, except
// that when that peer itself is gone the op fails as ErrPeerGone: toward a
// dead peer, the dead peer is the cause. The liveness check runs only on
// this rare path, not for every op.
func (r *Route) BlockedOrGone(op progress.Op, name []byte) error {
	err := r.Blocked()
	if err == nil {
		return nil
	}
	if gone, why := proc.Gone(ShmPeerPID(name)); gone {
		return &progress.PeerGoneError{Op: op, Provider: string(r.Provider), Peer: r.Addr(name), Cause: why}
	}
	return err
}
