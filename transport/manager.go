package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/topology"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// Manager owns the endpoints of this process (one per backend), the
// buffers registered on them, and the progress loops that drive them.
type Manager struct {
	cfg      config
	id       ID
	node     ID
	log      zerolog.Logger
	set      atomic.Pointer[backendSet] // the libfabric endpoints
	cma      *cma.Route                 // nil when not used
	guard    *guardTable
	reach    cma.Reach
	verifier *verifier // answers peers verifying this manager; nil without same-node backends
	verified peers     // owners this manager verified (or failed to)
	memOn    bool      // the mem route: buffers shared with, and mapped from, verified peers
	memPeers memPeers  // the peers that map this manager's buffers

	railsOnce sync.Once
	// railsActive counts requests over the rails; railsWake wakes
	// watchRails from idle, railsStop ends it (Close).
	railsActive atomic.Int32
	railsWake   chan struct{}
	railsStop   chan struct{}
	railState   []railHealth  // per rail (health)
	topo        topology.Tree // where the rails' NICs and the memory sit (nearRails)
	probeOnce   sync.Once     // makes probeBuf, where rail probes read into
	probeBuf    *Buffer
	probeErr    error

	// guardDirect: shm handle checks read the owner's guard entry with
	// process_vm_readv themselves where shm would (shmCheckDirect).
	guardDirect bool

	mu     sync.RWMutex // read-held while a transfer, registration or replacement is set up, and through memFast's copy; held to close
	closed bool
	// closing is set, and quit closed, as Close is called, before it
	// waits for mu: a request that comes after fails at once instead of
	// queueing behind Close, and one waiting for a same-node owner's
	// answer under mu's read hold gives up (reqTimes.waitFor).
	closing   atomic.Bool
	quit      chan struct{}
	closeOnce sync.Once
	// quitCtx is done, with ErrClosed as its cause, once quit is closed:
	// for the waits under mu's read hold that take a context (withQuit).
	quitCtx context.Context
	endQuit context.CancelCauseFunc
	// copying counts the requests in their copy phase (memcpy, cma, mem:
	// counted under mu's read hold); requests, those between their hold
	// of the manager and their release of its buffers. Close waits for
	// both (awaitNone): after it no request of this manager touches
	// memory, and mr.Free may take it.
	copying, requests atomic.Int64
	// down is set as Close begins: a copy still running (mem; one Close
	// gave up waiting for) learns that its owner link ended because this
	// manager closes, not the owner.
	down atomic.Bool
	// replaceMu: a replacement holds it, a registration reads it, so
	// that a buffer is registered on one consistent set of backends.
	replaceMu sync.RWMutex
	// deathsMu: one check of the shm endpoint after peers' deaths at a
	// time (afterPeerDeaths); deathsChecked is the verifier's death count
	// the last good check covered.
	deathsMu      sync.Mutex
	deathsChecked uint64
	bufsMu        sync.Mutex
	bufs          map[uint64]*bufState
	// closingBufs: buffers whose Close has begun and whose registrations
	// are not all closed yet. Peers no longer find them (bufs), but a
	// Manager.Close or a rail's replacement closing an endpoint closes
	// their registrations there, as it does the open buffers'.
	closingBufs map[uint64]*bufState
	nextID      atomic.Uint64
	// shmOutClosed counts the Outgoing shm endpoints closed (shmout.go).
	shmOutClosed atomic.Int64
	// releasers counts lookAgain's goroutines.
	releasers atomic.Int64
	// rotating is the first shm endpoint being replaced because peers
	// left its map full (rotateIfFull); nil when none is.
	rotating atomic.Pointer[libfabric.Route]
	// leftBudget, leftLimit: the package's when the manager opened
	// (rotateIfFull).
	leftBudget, leftLimit int
}

// backendSet is the manager's libfabric backends. It is replaced whole,
// never changed in place, so that a reader holds one consistent view:
// when a wedged shm endpoint is swapped for a new one, the wedged backend
// stays in all (retired), so that every backend keeps its index.
type backendSet struct {
	all      []*libfabric.Route // by index
	sameNode *libfabric.Route   // shm; nil when none
	// shmOut is the shm endpoint this manager's own shm ops go out on,
	// on libfabric 2.x (shmout.go); nil on 1.x, where sameNode does.
	shmOut *libfabric.Route
	remote *libfabric.Route // nil when none; rails[0]
	// rails are the endpoints of the remote provider, one per domain
	// (NIC), by Rail; a failed rail's place is taken by a new endpoint.
	rails []*libfabric.Route
	// indexes is how many indexes were given out: the next endpoint's.
	// A closed Outgoing shm endpoint leaves all; its index is not reused.
	indexes int
}

// backends is the current set.
func (m *Manager) backends() *backendSet { return m.set.Load() }

// New opens the backends this machine offers — see fabric.Select, or
// WithProviders — and starts their progress loops.
func New(ctx context.Context, opts ...Option) (*Manager, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if ctx == nil {
		return nil, nilContext("transport.New")
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("transport.New: WithTimeout(%v): want a positive duration (the deadline of transfers whose context has none)", cfg.timeout)
	}
	if ip := net.ParseIP(cfg.source); ip != nil && ip.IsUnspecified() {
		// Peers refuse an endpoint name with no address of a host in it.
		return nil, fmt.Errorf("transport.New: WithSourceAddress(%q): a wildcard address; give one of this host's addresses", cfg.source)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m := &Manager{cfg: cfg, id: newManagerID(), node: NodeID(), log: cfg.log, bufs: map[uint64]*bufState{}, closingBufs: map[uint64]*bufState{},
		topo: topology.Tree{Root: "/sys"}, quit: make(chan struct{}), leftBudget: leftBudget, leftLimit: leftLimit}
	m.quitCtx, m.endQuit = context.WithCancelCause(context.Background())
	infos, err := m.discover()
	if err != nil {
		return nil, err
	}
	type pick struct {
		info   *fabric.Info
		reason string
		role   string
	}
	var picks []pick
	useCMA, cmaWhy := cma.Available()
	m.memOn, _ = mem.Enabled()
	if len(cfg.providers) > 0 {
		useCMA, m.memOn = false, false
		for _, p := range cfg.providers {
			p = canonicalProvider(p)
			if p == mem.Name {
				if ok, why := mem.Enabled(); !ok {
					return nil, fmt.Errorf("the mem route is not used here: %s", why)
				}
				m.memOn = true
				continue
			}
			if p == cma.Name {
				if ok, why := cma.Available(); !ok {
					return nil, fmt.Errorf("the cma path is not used here: %s", why)
				}
				useCMA = true
				continue
			}
			in := firstRMA(infos, p)
			if in == nil {
				return nil, fmt.Errorf("provider %q offers no RDM endpoint with RMA here (usable here: %s); see `fitransfer doctor`", p, usableProviders(infos))
			}
			picks = append(picks, pick{in, "requested with WithProviders", "forced"})
		}
	} else {
		facts := fabric.ProbeDeviceRMA(infos)
		sn, snErr := fabric.Select(infos, fabric.SameNode, cfg.policy, facts)
		rm, rmErr := fabric.Select(infos, fabric.Remote, cfg.policy, facts)
		if snErr != nil && rmErr != nil {
			return nil, rmErr
		}
		if snErr == nil && sn.Info != nil {
			picks = append(picks, pick{sn.Info, sn.Reason, "same node"})
		}
		if rmErr == nil && rm.Info != nil && (snErr != nil || !sameInfo(sn.Info, rm.Info)) {
			picks = append(picks, pick{rm.Info, rm.Reason, "remote"})
		}
		for _, c := range []fabric.Choice{sn, rm} {
			for _, s := range c.Skipped {
				m.log.Info().Str("skipped", s).Msg("backend selection")
			}
		}
	}
	for i, p := range picks {
		if p.info.Fabric.ProvName == string(fabric.BackendSHM) {
			continue
		}
		rails, err := m.railInfos(infos, p.info)
		if err != nil {
			return nil, err
		}
		var more []pick
		for j, in := range rails {
			role := p.role
			if len(rails) > 1 {
				role = fmt.Sprintf("%s, rail %d of %d", p.role, j, len(rails))
			}
			more = append(more, pick{in, p.reason, role})
		}
		picks = append(picks[:i], append(more, picks[i+1:]...)...)
		break // the first remote provider is the one that stripes
	}
	bs := &backendSet{}
	m.set.Store(bs)
	for _, p := range picks {
		if p.info.Fabric.ProvName == string(fabric.BackendSHM) {
			reclaimOnce.Do(func() {
				if gone := reclaimShmRegions("/dev/shm"); len(gone) > 0 {
					m.log.Info().Strs("regions", gone).Msg("removed the shm regions of dead processes")
				}
			})
		}
		b, err := m.open(bs.indexes, p.info, p.reason, p.role)
		if err != nil {
			m.Close()
			return nil, err
		}
		bs.all, bs.indexes = append(bs.all, b), bs.indexes+1
		m.log.Info().Str("provider", b.Name()).Str("domain", b.Info.Domain.Name).Str("role", p.role).
			Str("reason", p.reason).Msg("backend open")
	}
	for _, b := range bs.all {
		switch {
		case b.Provider == fabric.BackendSHM && bs.sameNode == nil:
			bs.sameNode = b
		case b.Provider != fabric.BackendSHM && bs.remote == nil:
			bs.remote = b
			bs.rails = append(bs.rails, b)
		case bs.remote != nil && b.Provider == bs.remote.Provider && len(bs.rails) < len(bs.all):
			b.Rail = len(bs.rails)
			bs.rails = append(bs.rails, b)
		}
	}
	if useCMA {
		m.cma = &cma.Route{Role: "same node",
			Reason: "cma: process_vm_readv/writev by fitransfer (libfabric 1.x's shm can deadlock a target whose initiator dies mid-copy)"}
		if len(cfg.providers) > 0 {
			m.cma.Role, m.cma.Reason = "forced", "requested with WithProviders"
		}
	} else if len(cfg.providers) == 0 {
		m.log.Info().Str("why", cmaWhy).Msg("cma path not used")
	}
	if len(bs.rails) > 1 {
		m.railsWake, m.railsStop = make(chan struct{}, 1), make(chan struct{})
		go m.watchRails()
	}
	if ok, _ := cma.Available(); ok && bs.sameNode != nil {
		m.guardDirect = libfabric.SingleCopy()
	}
	if m.cma != nil || bs.sameNode != nil || m.memOn {
		if m.guard, err = newGuardTable(); err != nil {
			m.Close()
			return nil, err
		}
		if bs.sameNode != nil {
			if err := bs.sameNode.RegisterScratch(m.guard.mem, guardEntrySize, scratchSlots); err != nil {
				m.Close()
				return nil, err
			}
			if bs.sameNode.RecyclesSlots() {
				out, err := m.newShmOut(bs.indexes, bs.sameNode)
				if err != nil {
					m.Close()
					return nil, err
				}
				bs.all, bs.shmOut, bs.indexes = append(bs.all, out), out, bs.indexes+1
			}
		}
		if err := m.startVerifier(); err != nil {
			m.Close()
			return nil, err
		}
	}
	liveCount.Add(1) // first: the count is never below the map's size
	liveManagers.Store(m.id, m)
	return m, nil
}

// liveManagers are this process's open managers, by ID: a handle of one
// of them is served by a copy in this process, checked against its
// owner's own record, never by a same-node route toward this process.
var liveManagers sync.Map

// liveCount is at least how many managers liveManagers holds (exactly,
// outside New and Close).
var liveCount atomic.Int32

// closedManagers are the IDs of the last managers of this process that
// closed: a handle of one of them names an owner that is gone, where a
// handle naming this process and an ID it never had is forged.
var closedManagers recentIDs

// recentIDs keeps the last len(ids) IDs added.
type recentIDs struct {
	mu   sync.Mutex
	ids  [256]ID
	next int
}

func (r *recentIDs) add(id ID) {
	r.mu.Lock()
	r.ids[r.next%len(r.ids)] = id
	r.next++
	r.mu.Unlock()
}

func (r *recentIDs) has(id ID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < min(r.next, len(r.ids)); i++ {
		if r.ids[i] == id {
			return true
		}
	}
	return false
}

// discover runs fi_getinfo with fitransfer's RMA hints; with
// WithSourceAddress, IP providers are asked for that local address.
func (m *Manager) discover() ([]fabric.Info, error) {
	hints := func(prov string) *fabric.Info {
		h := fabric.RMAHints(prov)
		if m.cfg.hmem {
			fabric.WithHMEM(h)
		}
		return h
	}
	infos, err := fabric.GetInfo(fabric.Query{Hints: hints("")})
	if m.cfg.hmem && errors.Is(err, fabric.ErrNoData) {
		return nil, fmt.Errorf("%w: no provider here registers device memory (FI_HMEM with FI_MR_HMEM): %v", ErrDeviceMemory, err)
	}
	if err != nil && !errors.Is(err, fabric.ErrNoData) {
		return nil, err
	}
	if err == nil && fabric.RuntimeVersion().Major() >= 2 {
		infos = m.replaceProvider(infos, string(fabric.BackendSHM), func() ([]fabric.Info, error) {
			return fabric.GetInfo(fabric.Query{Hints: fabric.WithoutShmFastRMA(hints(string(fabric.BackendSHM)))})
		})
	}
	if m.cfg.source == "" || m.railsNamed() || !m.mayUseTCP(infos) {
		// Named rails bind to their domains' own addresses; without tcp
		// a source address binds nothing (the CLI gives one always).
		if err != nil {
			return nil, err
		}
		return infos, nil
	}
	tcp, terr := fabric.GetInfo(fabric.Query{Hints: hints(string(fabric.BackendTCP)), Node: m.cfg.source, Source: true})
	if terr != nil {
		return nil, fmt.Errorf("tcp;ofi_rxm on source address %q: %w", m.cfg.source, terr)
	}
	var out []fabric.Info
	for _, in := range infos {
		if in.Fabric.ProvName != string(fabric.BackendTCP) {
			out = append(out, in)
		}
	}
	return append(out, tcp...), nil
}

// mayUseTCP reports whether this manager may open tcp;ofi_rxm: it is
// among the forced providers, or none are forced and libfabric offers it
// here (FI_PROVIDER may leave it out).
func (m *Manager) mayUseTCP(infos []fabric.Info) bool {
	if len(m.cfg.providers) == 0 {
		return firstRMA(infos, string(fabric.BackendTCP)) != nil
	}
	for _, p := range m.cfg.providers {
		if canonicalProvider(p) == string(fabric.BackendTCP) {
			return true
		}
	}
	return false
}

// replaceProvider swaps the infos of provider for those query returns.
// If the query fails, the provider is dropped rather than used with the
// settings the query was meant to change.
func (m *Manager) replaceProvider(infos []fabric.Info, provider string, query func() ([]fabric.Info, error)) []fabric.Info {
	var out []fabric.Info
	found := false
	for _, in := range infos {
		if in.Fabric.ProvName == provider {
			found = true
			continue
		}
		out = append(out, in)
	}
	if !found {
		return infos
	}
	again, err := query()
	if err != nil {
		m.log.Warn().Err(err).Str("provider", provider).Msg("provider left out: the query with fitransfer's settings for it failed")
		return out
	}
	return append(out, again...)
}

func (m *Manager) open(index int, info *fabric.Info, reason, role string) (*libfabric.Route, error) {
	b, err := libfabric.Open(index, info, reason, role, m.cfg.poll, m.log, m.cfg.chunk)
	if err == nil && b.Provider == fabric.BackendSHM {
		// shm's CQ has no wait object that wakes on a peer's command, so
		// its loop would poll every MaxSleep forever; but a peer reaches
		// this endpoint only through the verifier, and announces its shm
		// use there first: the verifier holds an Attend for it
		// (startVerifier). While no peer has, the loop parks.
		b.ParkWhenUnattended()
	}
	return b, err
}

func canonicalProvider(p string) string {
	if p == "tcp" {
		return string(fabric.BackendTCP)
	}
	return p
}

func firstRMA(infos []fabric.Info, provider string) *fabric.Info {
	for i := range infos {
		in := &infos[i]
		if in.EP.Type != fabric.EPRDM || !in.Caps.Has(fabric.RMACaps) {
			continue
		}
		if libfabric.Name(in) == provider {
			return in
		}
	}
	return nil
}

// usableProviders lists what WithProviders may name here: the mem route
// and cma where this host allows them, and the libfabric providers with
// an RDM endpoint with RMA (as fabric.Info names them: "tcp;ofi_rxm").
func usableProviders(infos []fabric.Info) string {
	var out []string
	if ok, _ := mem.Enabled(); ok {
		out = append(out, mem.Name)
	}
	if ok, _ := cma.Available(); ok {
		out = append(out, cma.Name)
	}
	for i := range infos {
		in := &infos[i]
		if name := libfabric.Name(in); firstRMA(infos, name) == in && !contains(out, name) {
			out = append(out, name)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func sameInfo(a, b *fabric.Info) bool {
	return a != nil && b != nil && a.Fabric.ProvName == b.Fabric.ProvName &&
		a.Fabric.Name == b.Fabric.Name && a.Domain.Name == b.Domain.Name
}

// ID identifies this manager in the handles of its buffers.
func (m *Manager) ID() ID { return m.id }

// Backends lists the transports this manager opened, with why.
func (m *Manager) Backends() []Backend {
	var out []Backend
	if m.memOn {
		role, why := "same node", "mem: buffers from mr.Alloc are memfds; a verified process of this user maps them and copies, no system call per op"
		if len(m.cfg.providers) > 0 {
			role, why = "forced", "requested with WithProviders"
		}
		out = append(out, Backend{Provider: mem.Name, Role: role, Reason: why, Address: cma.Peer(os.Getpid())})
	}
	if c := m.cma; c != nil {
		out = append(out, Backend{Provider: c.Name(), Role: c.Role, Reason: c.Reason, Address: cma.Peer(os.Getpid())})
	}
	for _, b := range m.backends().all {
		role := b.Role
		if b.Retired.Load() {
			role = "retired"
		}
		out = append(out, Backend{Provider: b.Name(), Fabric: b.Info.Fabric.Name, Domain: b.Info.Domain.Name,
			Role: role, Reason: b.Reason, Address: b.Address()})
	}
	return out
}

// Route is how a transfer with a remote buffer would go.
type Route struct {
	Backend  string          // "memcpy", "shm", "tcp;ofi_rxm", "efa", ...
	Locality fabric.Locality // where the owner is
	Reason   string
	Peer     string // the owner's endpoint address on that backend, printable
	// Host is the IP address of the owner's endpoint on IP providers
	// (tcp;ofi_rxm), "" on the others: where the op's traffic goes.
	Host string
}

// Route says which backend a transfer with r would use, and why; an error
// wrapping ErrNoRoute when none can, or the class of what rules the owner
// out (ErrPeerGone for a same-node owner that exited, ErrAccessDenied for
// one of another user that offers no other route). Toward a same-node
// owner it may wait for the owner's answer (its verification, the mem
// link) up to the manager's timeout: an error wrapping ErrTimeout then,
// or ErrClosed when the manager closes meanwhile.
func (m *Manager) Route(r RemoteBuffer) (Route, error) {
	if m.closing.Load() {
		return Route{}, ErrClosed
	}
	rt, err := m.route(&r, 0, &reqTimes{ctx: context.Background(), timeout: m.cfg.timeout, quit: m.quit})
	if err != nil {
		return Route{Locality: rt.loc}, err
	}
	b, ep, loc := rt.b, rt.ep, rt.loc
	if rt.kind == route.Memcpy {
		reason := "the buffer belongs to this manager"
		if rt.owner != m {
			reason = "the buffer belongs to another manager of this process"
		}
		return Route{Backend: string(fabric.BackendMemcpy), Locality: loc, Reason: reason}, nil
	}
	reason := fmt.Sprintf("owner is on %s; both ends have %s", loc, ep.provider)
	switch {
	case rt.peer != nil:
		reason += fmt.Sprintf("; owner process %d verified by the kernel (same user)", rt.peer.pid)
	case loc == fabric.SameNode && rt.refused != "":
		reason += " (no same-node route: " + rt.refused + ")"
	case loc == fabric.SameNode && rt.noShm != "":
		reason += " (" + rt.noShm + ")"
	case loc == fabric.SameNode:
		reason += " (neither cma nor shm on both sides)"
	}
	if rt.peer != nil && (rt.kind == route.CMA || rt.kind == route.Fabric && b.Provider == fabric.BackendSHM) {
		reason += m.closeNote(rt.kind, rt.peer)
	}
	if rt.kind == route.CMA || rt.kind == route.Mem {
		return Route{Backend: ep.provider, Locality: loc, Reason: reason, Peer: cma.Peer(rt.peer.pid)}, nil
	}
	host := ""
	if hp := libfabric.SockaddrHostPort(ep.name); hp != "" && b.Provider == fabric.BackendTCP {
		host, _, _ = net.SplitHostPort(hp)
	}
	return Route{Backend: b.Name(), Locality: loc, Reason: reason, Host: host, Peer: b.Addr(ep.name)}, nil
}

// closeNote says what the owner's Close does to this manager's ops under
// way toward peer on a cma or shm route: it waits for them (runCMA,
// markShmPart: the copies this process makes, or the shm parts the
// owner's provider copies; route took the link they mark through), and
// an shm op on a closed buffer ends at its job's next check
// (Xfer.WatchGen).
func (m *Manager) closeNote(kind route.Kind, peer *sameNodePeer) string {
	if kind == route.CMA || m.singleCopyTo(peer) {
		return "; its Close waits for these copies (use page mapped)"
	}
	return fmt.Sprintf("; its Close waits for these ops, and an op on a buffer it closed ends at its next check, every %v (use page mapped)", progress.CheckEvery)
}

// matchesPeer checks a same-node endpoint of a handle against its owner
// as the kernel verified it: a handle whose process, shm address or guard
// table is not its owner's is stale or forged.
func matchesPeer(r *RemoteBuffer, ep *remoteEP, peer *sameNodePeer) error {
	shm := ep.provider != cma.Name && ep.provider != mem.Name
	switch {
	case shm && string(ep.name) != string(peer.shmName) && peer.shmName != nil && libfabric.ShmNameOf(ep.name, peer.pid):
		// Another endpoint of the owner's own: not forged, replaced.
		return fmt.Errorf("%w: buffer %d's handle names an shm endpoint that its owner (process %d) has replaced since (it replaces one stuck inside libfabric, or one its dead peers left full); a buffer registered before keeps its other routes (cma, tcp): reach it over one of those, or ask the owner for the handle of a buffer registered since",
			ErrStaleHandle, r.id, peer.pid)
	case ep.guard == nil || ep.guard.table != peer.guardFor(ep.provider).table || ep.guard.key != peer.guardFor(ep.provider).key:
		return fmt.Errorf("%w: buffer %d's guard table is not its owner's (process %d)", ErrStaleHandle, r.id, peer.pid)
	case ep.guard.slot >= guardSlots:
		return fmt.Errorf("%w: buffer %d's guard slot %d is out of range", ErrStaleHandle, r.id, ep.guard.slot)
	case (ep.provider == cma.Name || ep.provider == mem.Name) && cma.PID(ep.name) != peer.pid:
		return fmt.Errorf("%w: the handle names process %d, its owner is process %d", ErrStaleHandle, cma.PID(ep.name), peer.pid)
	case shm && string(ep.name) != string(peer.shmName):
		return fmt.Errorf("%w: the handle's shm address is not its owner's (process %d)", ErrStaleHandle, peer.pid)
	}
	return nil
}

// routed is where a handle's transfers go.
type routed struct {
	kind  route.Kind
	b     *libfabric.Route // the fabric route; nil on the others
	ep    *remoteEP        // the handle's endpoint on b
	loc   fabric.Locality
	owner *Manager      // the owning manager, when it is in this process
	peer  *sameNodePeer // the verified owner process, on a same-node route
	link  *memLink      // the mem route's link to it
	// settled: a mem route the next op on the handle may take again
	// without routing (keepMemo): the handle agrees with what the owner
	// told when verified, so routing it would not ask the owner again.
	settled bool
	// refused says why a same-node owner got no same-node route.
	refused string
	// gone is set when that is because the owner is gone.
	gone *progress.PeerGoneError
	// noShm says why no same-node route was taken toward a verified
	// owner that offers one (sameNodePeer.shmMismatch, a failed link).
	noShm string
}

// route picks the backend for a handle: a copy when the owner is a
// manager of this process; cma, else shm, when the owner is on this node,
// the kernel verified it (sameNodePeer) and both have the route; else the
// remote backend if the owner has it — on rail pin-1, or (pin 0) the rail
// pickRail chooses — else any backend both have.
//
// Toward a same-node owner it may wait for the owner's answers (its
// verification, the mem link's setup) within t's limits; past them it
// returns an *awaitError.
func (m *Manager) route(r *RemoteBuffer, pin int, t *reqTimes) (routed, error) {
	if r.IsZero() {
		return routed{loc: fabric.Remote}, fmt.Errorf("%w: zero RemoteBuffer", ErrBadHandle)
	}
	if r.owner == m.id {
		return routed{kind: route.Memcpy, loc: fabric.SameProcess, owner: m}, nil
	}
	// Another manager of this process is looked for only when there is
	// one: most processes have a single manager, and the map lookup was
	// a sixteenth of an 8 B mem op. The count is loaded before m.down:
	// Close sets down before it uncounts m, so a count without m always
	// comes with down set, and m is never taken off twice.
	others := liveCount.Load()
	if !m.down.Load() {
		others-- // m itself
	}
	if others > 0 {
		if o, ok := liveManagers.Load(r.owner); ok {
			return routed{kind: route.Memcpy, loc: fabric.SameProcess, owner: o.(*Manager)}, nil
		}
	}
	rt := routed{loc: fabric.Remote}
	if r.node == m.node {
		rt.loc = fabric.SameNode
	}
	bs := m.backends()
	cmaEP, shmEP, memEP := r.endpoint(cma.Name), (*remoteEP)(nil), r.endpoint(mem.Name)
	if bs.sameNode != nil {
		shmEP = r.endpoint(bs.sameNode.Name())
	}
	if !m.memOn {
		memEP = nil
	}
	if rt.loc == fabric.SameNode && (m.cma != nil && cmaEP != nil || shmEP != nil || memEP != nil) {
		peer, err := m.sameNodePeer(t, r.owner)
		if err == nil && shmEP != nil && peer.shmName != nil && string(shmEP.name) != string(peer.shmName) {
			// A handle newer than what the owner told: it may have
			// replaced its shm endpoint since. Ask it again (at most
			// once per owner every reverifyAfter: a forged handle must
			// not make every op a verification).
			peer, err = m.reverify(t, r.owner, peer)
		}
		// Every same-node route needs the link to the owner: the mem
		// route maps through it, and the owner's Close waits for the
		// cma copies and shm ops of this manager's marked in its use
		// page (runCMA, markShmPart). Without the marks an shm op goes on
		// after that Close: libfabric's shm moves a read, and a write
		// that asks for delivery, through bounce buffers over several
		// rounds of the owner's progress (SAR), and those rounds copy to
		// and from the buffer's memory after its registration closed
		// (smr_progress_sar_list, v1.17.0 and v2.1.0): an owner that
		// freed the memory crashed in them.
		var linkErr error
		var link *memLink
		var cmaOK, shmOK bool // the same-node routes route may take besides mem
		sameNodeOK := func() bool {
			cmaOK = m.cma != nil && cmaEP != nil && m.reach.Reaches(peer.pid, peer.cma.table)
			shmOK = shmEP != nil && peer.shmName != nil && peer.shmMismatch(bs.sameNode) == ""
			return memEP != nil || cmaOK || shmOK
		}
		if err == nil && memEP != nil {
			if err := matchesPeer(r, memEP, peer); err != nil {
				return rt, err
			}
		}
		if err == nil && sameNodeOK() {
			link, linkErr = peer.memLink(t)
			// This manager verified the owner again since it took peer
			// (reverify, evict, or the owner asked), and ended peer's
			// link: the new verification's, which may have been replaced
			// in turn, up to maxRetake times: an owner that asks to be
			// verified again at every dial must not keep a request
			// verifying it until its deadline. (A verification that
			// fails is err's, below: the old link's outcome is not this
			// peer's.)
			for again := 0; err == nil && peer.replaced.Load(); again++ {
				if again == maxRetake {
					linkErr = &memLinkEnded{pid: peer.pid}
					break
				}
				link, linkErr = nil, nil
				if peer, err = m.sameNodePeer(t, r.owner); err == nil {
					if memEP != nil {
						if err := matchesPeer(r, memEP, peer); err != nil {
							return rt, err
						}
					}
					if sameNodeOK() {
						link, linkErr = peer.memLink(t)
					}
				}
			}
			if ae, ok := linkErr.(*awaitError); ok {
				ae.provider = m.sameNodeRoute(memEP != nil, cmaOK)
				return rt, ae // the limits ended: no other route is tried for them
			}
		}
		if ae, ok := err.(*awaitError); ok {
			// The owner's process as the handle names it: only to name
			// it in the error, it is not verified yet.
			switch {
			case memEP != nil:
				ae.provider, ae.pid = mem.Name, cma.PID(memEP.name)
			case m.cma != nil && cmaEP != nil:
				ae.provider, ae.pid = cma.Name, cma.PID(cmaEP.name)
			default:
				ae.provider, ae.pid = bs.sameNode.Name(), libfabric.ShmPeerPID(shmEP.name)
			}
			return rt, ae
		}
		switch {
		case err == nil:
		case errors.Is(err, errNoAnswer):
			// Nobody answers for the owner. Only to explain that, the
			// process the handle names is looked at: if it is gone, so
			// is the owner.
			pid := 0
			switch {
			case cmaEP != nil:
				pid = cma.PID(cmaEP.name)
			case memEP != nil:
				pid = cma.PID(memEP.name)
			default:
				pid = libfabric.ShmPeerPID(shmEP.name)
			}
			if gone, why := proc.Gone(pid); gone {
				rt.gone = &progress.PeerGoneError{Peer: cma.Peer(pid), Cause: why}
			} else if pid == os.Getpid() && closedManagers.has(r.owner) {
				// A manager of this process that closed (an open one
				// would have been found above, liveManagers); an ID this
				// process never had is a forged handle's, refused below.
				rt.gone = &progress.PeerGoneError{Peer: cma.Peer(pid), Cause: "the buffer's manager, in this process, closed"}
			}
			rt.refused = sameNodeRefusal(err)
		default:
			// peerGoneOf, not errors.As(err, &rt.gone): taking rt's
			// address would move rt to the heap on every op.
			if rt.gone = peerGoneOf(err); rt.gone != nil {
				rt.refused = err.Error()
			} else {
				rt.refused = sameNodeRefusal(err)
			}
		}
		if rt.gone != nil {
			switch {
			case memEP != nil:
				rt.gone.Provider = mem.Name
			case m.cma != nil && cmaEP != nil:
				rt.gone.Provider = cma.Name
			default:
				rt.gone.Provider = bs.sameNode.Name()
				rt.gone.Peer = bs.sameNode.Addr(shmEP.name) // as the shm route's other errors name it
			}
		}
		switch {
		case err != nil:
		case linkErr != nil:
			rt.gone = peerGoneOf(linkErr)
			var refused *memAnswerError
			if rt.gone == nil && !errors.As(linkErr, &refused) {
				// The dial failed (nobody answered, the connection
				// ended, another process answers): the owner may have
				// died since its verification.
				if gone, why := proc.Gone(peer.pid); gone {
					rt.gone = &progress.PeerGoneError{Peer: cma.Peer(peer.pid), Cause: why}
				}
			}
			switch {
			case rt.gone != nil:
				rt.gone.Provider = m.sameNodeRoute(memEP != nil, cmaOK)
				if !(memEP != nil || cmaOK) && shmEP != nil && bs.sameNode != nil {
					rt.gone.Peer = bs.sameNode.Addr(shmEP.name)
				}
			case linkEnded(linkErr):
				// Verified again maxRetake times while it routed: nothing
				// moved, and a request made again takes the verification
				// that stands then (Retryable).
				return rt, linkErr
			default:
				rt.noShm = fmt.Sprintf("no same-node route to process %d: the link its Close waits for this manager's ops through failed (%v)", peer.pid, linkErr)
			}
		case memEP != nil:
			rt.kind, rt.ep, rt.peer, rt.link = route.Mem, memEP, peer, link
			rt.settled = shmEP == nil || peer.shmName == nil || string(shmEP.name) == string(peer.shmName)
			return rt, nil
		case cmaOK:
			rt.kind, rt.ep, rt.peer = route.CMA, cmaEP, peer
			return rt, matchesPeer(r, cmaEP, peer)
		case shmEP != nil && peer.shmName != nil && !shmOK:
			rt.noShm = peer.shmMismatch(bs.sameNode) // another route, if both have one
		case shmOK:
			rt.kind, rt.b, rt.ep, rt.peer = route.Fabric, bs.shmOutgoing(), shmEP, peer
			return rt, matchesPeer(r, shmEP, peer)
		}
	}
	if bs.remote != nil {
		if b, ep := m.onRail(bs, r, pin); ep != nil && !b.OtherFamily(ep.name) {
			rt.kind, rt.b, rt.ep = route.Fabric, b, ep
			return rt, nil
		}
	}
	var otherFamily *libfabric.Route
	for _, b := range bs.all {
		if b.Provider == fabric.BackendSHM || b.Retired.Load() {
			continue // same-node routes only toward a verified owner, above
		}
		if ep := r.endpoint(b.Name()); ep != nil {
			if b.OtherFamily(ep.name) {
				otherFamily = b // neither reaches the other
				continue
			}
			rt.kind, rt.b, rt.ep = route.Fabric, b, ep
			return rt, nil
		}
	}
	var local []string
	for _, b := range bs.all {
		if !b.Retired.Load() && !b.Outgoing {
			local = append(local, b.Name())
		}
	}
	if m.cma != nil {
		local = append(local, cma.Name)
	}
	if m.memOn {
		local = append(local, mem.Name)
	}
	if rt.gone != nil {
		return rt, rt.gone
	}
	if rt.refused != "" {
		return rt, fmt.Errorf("%w: the owner is on this node but no same-node route may be used (%s), and it offers no other route this manager has (owner: %v, here: %v)",
			ErrAccessDenied, rt.refused, r.Providers(), local)
	}
	if otherFamily != nil {
		return rt, fmt.Errorf("%w: the owner's %s endpoint has an address of the other IP family than this manager's, which is %s (%s); neither reaches the other: give this manager a source address of the owner's family (WithSourceAddress, the CLI's -s), or reach the owner over an address of this one's",
			ErrNoRoute, otherFamily.Name(), otherFamily.Family(), otherFamily.Address())
	}
	if rt.noShm != "" {
		return rt, fmt.Errorf("%w: %s; the owner offers no other route this manager has (owner: %v, here: %v)",
			ErrNoRoute, rt.noShm, r.Providers(), local)
	}
	if len(r.eps) == 0 {
		// No decoded or registered handle is empty (check): only Via
		// empties one, given a route that was not this handle's.
		return rt, fmt.Errorf("%w: the handle names no endpoint of its owner: RemoteBuffer.Via keeps only the endpoints of the route it is given; give it the Route that Manager.Route returned for this handle", ErrNoRoute)
	}
	return rt, fmt.Errorf("%w: owner (%s) offers %v, this manager has %v", ErrNoRoute, rt.loc, r.Providers(), local)
}

// sameNodeRoute names the same-node route route() takes toward an owner
// (mem when the handle has it and mem is on, else cma when it reaches the
// owner, else shm): for errors on the way there.
func (m *Manager) sameNodeRoute(viaMem, viaCMA bool) string {
	switch sn := m.backends().sameNode; {
	case viaMem:
		return mem.Name
	case viaCMA, sn == nil:
		return cma.Name
	default:
		return sn.Name()
	}
}

// peerGoneOf is the *progress.PeerGoneError in err's tree, or nil.
func peerGoneOf(err error) *progress.PeerGoneError {
	var gone *progress.PeerGoneError
	if errors.As(err, &gone) {
		return gone
	}
	return nil
}

// Poll progresses every backend once (skipping those another goroutine is
// progressing at the moment, and an idle shm endpoint but every 100 µs: a
// round of it costs microseconds, and would slow every look of the
// spinning caller). Transfers progress by themselves; Poll is
// for code that spins on its own memory waiting for a peer's write — a
// pingpong, a flag — and wants that spinning to drive progress too. An
// shm backend's round is its loop goroutine's (shm's calls may never
// return, so callers make none): Poll kicks it and blocks until that
// round, up to a millisecond. Peers' writes never come over an Outgoing
// shm endpoint: it is left to the ops that wait on it and to its loop.
func (m *Manager) Poll() {
	for _, b := range m.backends().all {
		if !b.Retired.Load() && !b.Outgoing {
			b.PollIfWanted()
		}
	}
}

// PollRoute is Poll for a caller whose peer's writes come over rt (a
// pingpong spinning on its memory: the route of its own writes to that
// peer). It progresses the backends of rt's provider as Poll does, and
// leaves the others to their own loops: a round of each at every look
// would delay seeing the caller's memory change by a cgo call or more,
// and a caller that only now and then polled them would hold their loops
// back (a loop stands back while a caller polls it) and slow what peers
// do over them. Routes that need no progress of this process for a
// peer's ops (memcpy, mem, cma) have no such backend. Under
// BusyPollPolicy the other loops spin meanwhile, a core each.
func (m *Manager) PollRoute(rt Route) {
	for _, b := range m.backends().all {
		if b.Name() == rt.Backend && !b.Retired.Load() && !b.Outgoing {
			b.PollIfWanted()
		}
	}
}

// Close closes the manager: transfers still in flight fail with ErrClosed
// (copies this process makes, memcpy, mem and cma, stop at their next
// 4 MiB piece), every buffer is deregistered, every endpoint closed, and
// the memory of Manager.Alloc buffers freed (their Bytes must not be used
// after Close; memory the caller registered stays the caller's, and
// mr.Free takes it from then on). Close waits for peers' copies with its
// buffers (mem, cma), for its own copies and for its transfers to let go
// of their buffers, all within the manager's timeout; a transfer still
// running then (on an endpoint stuck in a call) is logged. Later calls
// fail with ErrClosed. Closing twice is a no-op. It returns an error
// wrapping ErrEndpointWedged for each endpoint stuck inside libfabric:
// Close does not wait for such a call, and leaves the endpoint, its
// registrations and the memory they use to it (mr.Free refuses that
// memory then: it would pull memory from under libfabric).
func (m *Manager) Close() error {
	m.closeOnce.Do(func() {
		m.closing.Store(true)
		if m.quit != nil {
			close(m.quit)
		}
		if m.endQuit != nil {
			m.endQuit(ErrClosed)
		}
	})
	// A new shm endpoint under way (rotateShmOut, which holds no hold
	// of the manager) is in the set once this returns; later ones see
	// closing and open none.
	m.replaceMu.Lock()
	//lint:ignore SA2001 an empty critical section: a barrier
	m.replaceMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.down.Store(true)
	m.mu.Unlock()
	// One deadline for every wait below.
	deadline := time.Now().Add(m.cfg.timeout)
	// Copies under way end at their next piece (their limit's Quit):
	// none may run into the deregistrations below.
	m.awaitNone(&m.copying, deadline, "copying")
	if _, was := liveManagers.LoadAndDelete(m.id); was {
		liveCount.Add(-1) // not for a New that failed before it counted m
		closedManagers.add(m.id)
	}
	if m.railsStop != nil {
		close(m.railsStop)
	}
	m.bufsMu.Lock()
	bufs := m.bufs
	m.bufs = map[uint64]*bufState{}
	all := m.registeredBufs(bufs)
	m.bufsMu.Unlock()
	var errs []error
	// Peers copying with a buffer on the mem route finish first: the
	// caller frees the memory once Close returns.
	for _, st := range bufs {
		if peers := st.revokeGuard(deadline); peers != nil {
			st.mu.Lock()
			st.kept = true
			st.mu.Unlock()
			errs = append(errs, &InUseError{Buffer: st.id, Peers: peers, Waited: m.cfg.timeout})
		}
	}
	if m.verifier != nil {
		m.verifier.close()
	}
	m.memPeers.close()
	bs := m.backends()
	closeBackends := func(early bool) {
		for _, b := range bs.all {
			if b.AwaitsPeersMapping() != early {
				continue
			}
			// On the loop goroutine, after failing its jobs and before
			// closing the endpoint: MRs must be closed before their
			// endpoint.
			if err := closeRoute(b, all, nil); err != nil {
				errs = append(errs, fmt.Errorf("closing the %s endpoint: %w", b.Provider, err))
			}
		}
	}
	// A 1.x shm endpoint waits, as it closes, for the owners its ops
	// reached to map its region (libfabric.Route.CloseWith); their shm
	// loops poll for this manager only while its connections to them
	// are up (announceShm). So it closes before those end, and wakes the
	// owners first: closed after them, its last op could reach an owner
	// whose loop had parked, which mapped nothing within the wait and
	// crashed on the op later (TestClosingMidWriteLeavesTheOwnerAlive,
	// under load).
	for _, b := range bs.all {
		if b.AwaitsPeersMapping() {
			m.verified.wakeAll()
			break
		}
	}
	closeBackends(true)
	m.verified.close(m.closeOutgoing(all))
	closeBackends(false)
	// Not the closing ones: their own deregistration still runs, and says
	// whether an endpoint kept their MR.
	for _, st := range bufs {
		st.markClosed()
	}
	// The requests whose ops the closed loops failed let go of their
	// buffers now: after that nothing holds them, and their memory may
	// be freed (freeOwned below, or the caller's mr.Free).
	m.awaitNone(&m.requests, deadline, "ending")
	wedged := false
	for _, b := range bs.all {
		if !b.Stopped() {
			wedged = true // its endpoint may still use the memory below
			continue
		}
		b.FreeScratch()
	}
	if !wedged {
		for _, st := range all {
			st.freeOwned()
		}
	}
	if m.guard != nil {
		m.guard.life.Release() // peers' ops see a closed manager as before: the kernel says it lives
		if !wedged {
			_ = mr.Free(m.guard.mem)
			_ = mr.Free(m.guard.gens)
		}
	}
	return errors.Join(errs...)
}

// awaitNone waits, until deadline, for n (copying or requests) to be 0;
// past it, it logs what it left. A request on a wedged endpoint may stay
// until its own deadline.
func (m *Manager) awaitNone(n *atomic.Int64, deadline time.Time, what string) {
	for pause := 10 * time.Microsecond; n.Load() > 0; pause = min(2*pause, time.Millisecond) {
		if time.Now().After(deadline) {
			m.log.Warn().Int64("requests", n.Load()).Str("state", what).Msg("closing: requests still under way after the timeout")
			return
		}
		time.Sleep(pause)
	}
}

// registeredBufs lists the buffers of open that may hold registrations,
// with those whose Close has not closed them all yet. Under bufsMu.
func (m *Manager) registeredBufs(open map[uint64]*bufState) []*bufState {
	all := make([]*bufState, 0, len(open)+len(m.closingBufs))
	for _, st := range open {
		all = append(all, st)
	}
	for _, st := range m.closingBufs {
		all = append(all, st)
	}
	return all
}

// acquire holds the manager open for one operation.
func (m *Manager) acquire() error {
	if m.closing.Load() {
		return ErrClosed
	}
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (m *Manager) releaseManager() { m.mu.RUnlock() }

// replaceSameNode retires the shm backend old, whose endpoint is stuck
// (why): inside libfabric (libfabric's shm spins forever on a region
// lock a peer held when it died: 1.x's on every op, 2.x's on an
// initiator's few), or serving no command (2.x's shm, whose
// command queue a peer killed mid-post stalls), and opens a new shm
// endpoint in its place, so that one peer's death costs this manager its
// old shm endpoint (and the thread stuck in it, if one is) — not its
// same-node service. Buffers registered
// before keep their other routes; peers verified before re-verify and
// learn the new shm address. It does nothing when old is no longer the
// shm backend.
//
// It holds the manager only as a transfer does (read), so that transfers
// on other routes go on meanwhile: a writer waiting for a transfer stuck
// behind the wedged endpoint would stop every new one.
func (m *Manager) replaceSameNode(old *libfabric.Route, why error) error {
	if err := m.acquire(); err != nil {
		return nil // closing: nothing to replace
	}
	defer m.releaseManager()
	m.replaceMu.Lock()
	defer m.replaceMu.Unlock()
	cur := m.backends()
	if cur.sameNode != old || old.Retired.Load() {
		return nil
	}
	old.Retired.Store(true)
	next := &backendSet{all: append([]*libfabric.Route(nil), cur.all...), remote: cur.remote, rails: cur.rails, shmOut: cur.shmOut,
		indexes: cur.indexes + 1}
	b, err := m.open(cur.indexes, &old.Info, old.Reason, old.Role)
	if err == nil {
		if err = b.RegisterScratch(m.guard.mem, guardEntrySize, scratchSlots); err != nil {
			_ = b.Close()
		}
	}
	if err != nil {
		m.set.Store(next) // no shm any more: same-node peers use cma or the remote backend
		m.log.Error().Err(err).Msg("retired the stuck shm endpoint; a new one could not be opened")
		return err
	}
	next.all = append(next.all, b)
	next.sameNode = b
	m.set.Store(next)
	if m.verifier != nil {
		m.verifier.dropPeers() // they hold the old shm address
	}
	m.log.Warn().Err(why).Str("old", old.Address()).Str("new", b.Address()).
		Msg("shm endpoint retired, and a new one opened")
	return nil
}

// replaceIfStuck replaces the shm backend b when err, an operation's
// failure, came with b stuck inside libfabric.
func (m *Manager) replaceIfStuck(b *libfabric.Route, err error) bool {
	var we *progress.WedgedError
	if b == nil || !errors.As(err, &we) || b.Wedged() == nil {
		return false
	}
	switch bs := m.backends(); b {
	case bs.sameNode:
		return m.replaceSameNode(b, err) == nil
	case bs.shmOut:
		return m.rotateShmOut(b, nil) == nil
	}
	return false
}

// replaceStuckShm is replaceIfStuck for whichever shm endpoint err came
// with.
func (m *Manager) replaceStuckShm(err error) bool {
	bs := m.backends()
	return m.replaceIfStuck(bs.sameNode, err) || m.replaceIfStuck(bs.shmOut, err)
}
