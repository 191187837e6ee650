package transport

import (
	"encoding/binary"
	"fmt"
	"github.com/fitransfer/fitransfer/internal/proc"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/endpoint"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/ofi"
	"github.com/fitransfer/fitransfer/progress"
)

// backend is one open endpoint of the manager and its progress loop.
type backend struct {
	index    int
	provider fabric.Backend
	info     fabric.Info
	reason   string // why it was chosen
	role     string // "same node", "remote", or "forced"
	loop     *progress.Loop
	name     []byte // endpoint name, immutable
	virtAddr bool
	chunk    uint64       // largest op
	scratch  *scratchPool // shm: where handle checks land
	// retired: its endpoint is stuck inside libfabric and another took
	// its place (Manager.replaceSameNode); nothing uses it any more.
	retired atomic.Bool

	mu    sync.RWMutex
	peers map[string]*peer // endpoint name → address
	added map[string]int   // AddPeer calls not yet undone by RemovePeer, per name

	// shm: ops still in flight to peers that died (see blocked).
	deadOps   atomic.Int32
	deadSince atomic.Int64 // unix nanoseconds of the first
	deadPeer  atomic.Pointer[string]
}

// blockedGrace is how long ops to a dead shm peer may stay in flight
// before the endpoint counts as blocked: completions already written
// but not yet read drain well within it.
const blockedGrace = 200 * time.Millisecond

// abandonDead records ops left in flight to an shm peer that died.
func (b *backend) abandonDead(peer string) {
	if b.deadOps.Add(1) == 1 {
		b.deadPeer.Store(&peer)
		b.deadSince.Store(time.Now().UnixNano())
	}
}

// blocked returns an error wrapping ErrEndpointBlocked when ops to a dead
// peer have stayed in flight past blockedGrace. libfabric's shm takes an
// endpoint's completions from one queue in order (smr_progress_resp,
// prov/shm/src/smr_progress.c, v1.17.0 and v2.1.0): an op whose target
// died is never answered, and no later op on the endpoint completes
// either, whatever its peer. Failing at once beats a timeout per op.
func (b *backend) blocked() error {
	if b.deadOps.Load() == 0 {
		return nil
	}
	since := time.Duration(time.Now().UnixNano() - b.deadSince.Load())
	if since < blockedGrace {
		return nil
	}
	peer := "a peer"
	if p := b.deadPeer.Load(); p != nil {
		peer = *p
	}
	return fmt.Errorf("%w: the %s endpoint can complete no more ops: %s died %v ago with ops in flight, "+
		"and shm completes an endpoint's ops in order, so later ops would wait forever; "+
		"close the manager and open a new one (fitransfer's default same-node path, cma, keeps no such state)",
		ErrEndpointBlocked, b.provider, peer, since.Round(time.Millisecond))
}

// forget removes a peer from the address vector (which releases what the
// provider holds for it: shm's mapping of its region, rxm's connection),
// unless a transfer holds its address (peer.uses): an op posted to a
// removed address crashes libfabric. Insertion and removal both happen
// inside the loop's Do, so a peer found in b.peers is always inserted.
func (b *backend) forget(name []byte) {
	_ = b.loop.Do(func() {
		b.mu.Lock()
		p := b.peers[string(name)]
		if p == nil || p.uses.Load() > 0 {
			b.mu.Unlock()
			return
		}
		delete(b.peers, string(name))
		b.mu.Unlock()
		b.loop.Endpoint().ForgetPeer(name)
	})
}

type peer struct {
	addr uint64    // fi_addr_t
	name string    // printable
	drop *connDrop // tcp: its last dropped connection (tcpdrop.go)
	uses atomic.Int32
}

// done ends a use of p (see backend.peer).
func (p *peer) done() { p.uses.Add(-1) }

func newBackend(index int, ep *endpoint.Endpoint, loop *progress.Loop, reason, role string, chunkCap uint64) *backend {
	chunk := ep.MaxRMA()
	if chunkCap > 0 && chunkCap < chunk {
		chunk = chunkCap
	}
	return &backend{
		index: index, provider: fabric.Backend(transportName(ep.Info())), info: *ep.Info(), reason: reason, role: role,
		loop: loop, name: append([]byte(nil), ep.Name()...), virtAddr: ep.VirtAddr(),
		chunk: chunk, peers: map[string]*peer{},
	}
}

// checkName refuses an endpoint name a provider would misread: libfabric
// takes a name by its pointer alone and reads as many bytes as its
// address format implies.
func (b *backend) checkName(name []byte) error {
	want := len(b.name) // the format's size: this endpoint's own name
	switch b.info.AddrFormat {
	case ofi.AddrSockaddrIn:
		want = 16
	case ofi.AddrSockaddrIn6:
		want = 28
	case ofi.AddrSockaddr:
		want = 16
		if len(name) >= 2 && binary.LittleEndian.Uint16(name) == syscall.AF_INET6 {
			want = 28
		}
	}
	if b.provider == fabric.BackendSHM {
		want = len(name) // shm names come from a verified owner (samenode.go)
	}
	if len(name) != want || len(name) > maxEPNameLen {
		return fmt.Errorf("%w: a %s endpoint address of %d bytes (%v takes %d)", ErrBadHandle, b.provider, len(name), b.info.AddrFormat, want)
	}
	return nil
}

// peer returns the address of a peer endpoint, inserting it into the
// address vector (on the loop goroutine) the first time. It counts a use
// of it: the caller hands it back with done once no op uses the address.
func (b *backend) peer(name []byte) (*peer, error) {
	b.mu.Lock()
	p := b.peers[string(name)]
	if p != nil {
		p.uses.Add(1)
	}
	b.mu.Unlock()
	if p != nil {
		return p, nil
	}
	if err := b.checkName(name); err != nil {
		return nil, err
	}
	var err error
	if derr := b.loop.Do(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if p = b.peers[string(name)]; p != nil {
			p.uses.Add(1)
			return
		}
		var addr uint64
		if addr, err = b.loop.Endpoint().Peer(name); err != nil {
			return
		}
		p = &peer{addr: addr, name: ofi.Addr{Format: b.info.AddrFormat, Bytes: name}.String(), drop: new(connDrop)}
		p.uses.Add(1)
		b.peers[string(name)] = p
	}); derr != nil {
		return nil, derr
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

// Backend describes one transport a manager opened.
type Backend struct {
	Provider string // "shm", "tcp;ofi_rxm", "efa", ...
	Fabric   string
	Domain   string
	Role     string // "same node", "remote", or "forced" (WithProviders)
	Reason   string // why it was chosen
	Address  string // this manager's endpoint address on it
}

// blockedOrGone is b.blocked() for an op toward the shm endpoint name,
// except that when that peer itself is gone the op fails as
// ErrPeerGone: toward a dead peer, the dead peer is the cause. The
// liveness check runs only on this rare path, not for every op.
func (b *backend) blockedOrGone(op progress.Op, name []byte) error {
	err := b.blocked()
	if err == nil {
		return nil
	}
	if gone, why := proc.Gone(shmPeerPID(name)); gone {
		return &progress.PeerGoneError{Op: op, Provider: string(b.provider),
			Peer: ofi.Addr{Format: b.info.AddrFormat, Bytes: name}.String(), Cause: why}
	}
	return err
}
