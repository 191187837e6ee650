package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/topology"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// Striping (docs/ARCHITECTURE.md, "Rails"): a transfer of at least
// stripeMin bytes toward an owner reached over the remote provider is cut
// into one piece per rail in use, sized by the rails' link speeds and the
// bytes already queued on each; a smaller one goes whole to one rail. A
// request runs in rounds: the pieces of a rail that failed or stalled go
// again over the rails still up, until every piece is delivered, the
// request's deadline passes, or no rail is left (ErrNoRail).
const (
	stripeMin   = 1 << 20
	stripeAlign = 64 << 10 // pieces start on multiples of it
	// A rail with ops out that completes none for railStallFloor plus
	// railStallFactor times one op's time at the rate it showed
	// (defaultRailRate until it showed one) is taken as failed, not slow.
	railStallFloor  = time.Second
	railWatchEvery  = 50 * time.Millisecond
	railStallFactor = 4
	defaultRailRate = 10e6 // bytes per second
	// A rail that failed is probed — a read of probeSize bytes of a
	// transfer's remote buffer into the manager's own probe buffer — at
	// most every railProbeEvery.
	railProbeEvery = time.Second
	probeSize      = 4 << 10
)

// ErrNoRail: every rail of the remote provider failed during the
// transfer; it wraps the last errors seen.
var ErrNoRail = errors.New("no rail left")

// Rail is one of a manager's rails, as Rails reports it.
type Rail struct {
	Rail     int
	Provider string
	Domain   string
	Address  string
	Speed    uint64 // link speed fi_info reports, bits per second; 0 when unknown
	Up       bool
	Bytes    uint64 // bytes this manager's transfers moved over it (counted where there are two rails or more)
	Failures uint64 // times it was taken out of use
}

// railHealth is what the manager knows of one rail.
type railHealth struct {
	down      atomic.Bool
	probedAt  atomic.Int64 // UnixNano of the last probe (or failure)
	probing   atomic.Bool
	bytes     atomic.Uint64
	queued    atomic.Int64  // bytes of pieces in flight on it
	rate      atomic.Uint64 // math.Float64bits of bytes per second seen; 0: none yet
	failures  atomic.Uint64
	lastError atomic.Pointer[string]
}

func (h *railHealth) bytesPerSecond() float64 {
	if r := math.Float64frombits(h.rate.Load()); r > 0 {
		return r
	}
	return defaultRailRate
}

// railNames are the rails WithRails or FITRANSFER_RAILS name, and which.
func (m *Manager) railNames() ([]string, string) {
	if m.cfg.railsSet {
		return m.cfg.rails, "WithRails"
	}
	if names := EnvRails(); names != nil {
		return names, RailsEnv
	}
	return nil, ""
}

// EnvRails are the rails FITRANSFER_RAILS names, split at its commas; nil
// when it is unset or blank.
func EnvRails() []string {
	if v := strings.TrimSpace(os.Getenv(RailsEnv)); v != "" {
		return strings.Split(v, ",")
	}
	return nil
}

// railsNamed reports whether rails were named.
func (m *Manager) railsNamed() bool {
	names, _ := m.railNames()
	return len(names) > 0
}

// railInfos are the infos of the rails of first's provider: the domains
// WithRails or FITRANSFER_RAILS name, else every domain for efa, else
// first's alone.
func (m *Manager) railInfos(infos []fabric.Info, first *fabric.Info) ([]*fabric.Info, error) {
	names, from := m.railNames()
	return RailInfos(infos, first, names, from)
}

// RailInfos are the infos of the rails a Manager opens for first, the
// info of its remote provider, among infos (fi_getinfo's answer): the
// domains names lists ("all": every one), else every domain for efa and
// efa-direct, else first's alone. from says who named them, for the
// errors (RailsEnv, "WithRails"). `fitransfer doctor` and `info --rails`
// show the rails with it.
func RailInfos(infos []fabric.Info, first *fabric.Info, names []string, from string) ([]*fabric.Info, error) {
	provider := libfabric.Name(first)
	var domains []*fabric.Info // one per domain: the first RDM info with RMA, of first's address format
	for i := range infos {
		in := &infos[i]
		if libfabric.Name(in) != provider || in.EP.Type != fabric.EPRDM || !in.Caps.Has(fabric.RMACaps) || in.AddrFormat != first.AddrFormat {
			continue
		}
		dup := false
		for _, d := range domains {
			dup = dup || d.Domain.Name == in.Domain.Name
		}
		if !dup {
			domains = append(domains, in)
		}
	}
	all := func() []*fabric.Info {
		out := domains
		if provider == string(fabric.BackendTCP) && len(domains) > 1 {
			// Loopback reaches no other host: not a rail.
			out = nil
			for _, d := range domains {
				if d.Domain.Name != "lo" {
					out = append(out, d)
				}
			}
		}
		if len(out) > maxRails {
			return out[:maxRails]
		}
		return out
	}
	switch {
	case len(names) == 0 && (provider == string(fabric.BackendEFA) || provider == string(fabric.BackendEFADirect)):
		return all(), nil
	case len(names) == 0:
		return []*fabric.Info{first}, nil
	case len(names) == 1 && strings.TrimSpace(names[0]) == "all":
		return all(), nil
	case len(names) > maxRails:
		return nil, fmt.Errorf("%s names %d rails; at most %d", from, len(names), maxRails)
	}
	var out []*fabric.Info
	named := map[string]bool{}
	for _, name := range names {
		name = strings.TrimSpace(name)
		var found *fabric.Info
		var have []string
		for _, d := range domains {
			have = append(have, d.Domain.Name)
			if d.Domain.Name == name {
				found = d
			}
		}
		switch {
		case found == nil:
			return nil, fmt.Errorf("%s: %s has no domain %q here (its domains: %s); see `fitransfer info -p %s`",
				from, provider, name, strings.Join(have, ", "), provider)
		case named[name]:
			return nil, fmt.Errorf("%s names domain %q twice", from, name)
		}
		named[name] = true
		out = append(out, found)
	}
	return out, nil
}

// Rails reports the manager's rails: the endpoints of its remote provider,
// one per domain (NIC). Empty when it has no remote provider.
func (m *Manager) Rails() []Rail {
	bs := m.backends()
	out := make([]Rail, 0, len(bs.rails))
	for i, b := range bs.rails {
		h := m.health(i)
		r := Rail{Rail: i, Provider: b.Name(), Domain: b.Info.Domain.Name, Address: b.Address(),
			Up: !h.down.Load(), Bytes: h.bytes.Load(), Failures: h.failures.Load()}
		if n := b.Info.NIC; n != nil && n.Link != nil {
			r.Speed = n.Link.Speed
		}
		out = append(out, r)
	}
	return out
}

// health is rail i's record; rails keep their number when one takes a
// failed one's place, so the records are made once.
func (m *Manager) health(i int) *railHealth {
	m.railsOnce.Do(func() {
		m.railState = make([]railHealth, len(m.backends().rails))
	})
	return &m.railState[i]
}

// onRail is the rail route and the owner's endpoint an op toward r takes:
// rail pin-1, or (pin 0) the one pickRail chooses; the owner's endpoint of
// the same number when it has one, else of that number modulo its rails.
func (m *Manager) onRail(bs *backendSet, r *RemoteBuffer, pin int) (*libfabric.Route, *remoteEP) {
	name := bs.remote.Name()
	if len(bs.rails) < 2 {
		return bs.remote, r.endpoint(name)
	}
	n := r.rails(name)
	if n == 0 {
		return nil, nil
	}
	i := pin - 1
	if pin == 0 {
		i = m.pickRail(r, nil)
	}
	b := bs.rails[i]
	if ep := r.railEP(name, uint8(i)); ep != nil {
		return b, ep
	}
	if ep := r.railEP(name, uint8(i%n)); ep != nil {
		return b, ep
	}
	return b, r.endpoint(name)
}

// pickRail chooses the rail of an op that is not striped: among the rails
// up nearest the local memory (near; nil: every rail), else among the
// rails up, one by the owner, so that different owners spread over the
// rails and one owner's ops stay in order on one.
func (m *Manager) pickRail(r *RemoteBuffer, near []int) int {
	n := len(m.backends().rails)
	h := binary.LittleEndian.Uint64(r.owner[:8])
	var buf [maxRails]int
	up := buf[:0]
	for _, i := range near {
		if i < n && !m.health(i).down.Load() {
			up = append(up, i)
		}
	}
	if len(up) == 0 {
		for i := 0; i < n; i++ {
			if !m.health(i).down.Load() {
				up = append(up, i)
			}
		}
	}
	if len(up) == 0 {
		return int(h % uint64(n))
	}
	return up[h%uint64(len(up))]
}

// nearRails is the rails nearest st's memory (topology.Nearest): for
// device memory with a PCI address, those nearest the device; for host
// memory, those on its NUMA node; nil (every rail) when the rails' PCI
// addresses or the memory's place are not known. Worked out once per
// buffer.
func (m *Manager) nearRails(st *bufState) []int {
	st.nearOnce.Do(func() {
		nics, ok := m.railPCI()
		if !ok {
			return
		}
		var at topology.Location
		switch {
		case st.iface != mr.Host && st.devicePCI != "":
			a, err := topology.ParsePCIAddr(st.devicePCI)
			if err != nil {
				return
			}
			at = topology.DeviceMemory(a)
		case st.iface == mr.Host && st.mem != nil:
			node, err := topology.HostNode(st.mem)
			if err != nil {
				return
			}
			at = topology.HostMemory(node)
		default:
			return
		}
		if near := m.topo.Nearest(nics, at); len(near) < len(nics) {
			st.near = near
		}
	})
	return st.near
}

// railPCI is the PCI address of each rail's NIC, from fi_info; false
// when a rail has none (tcp).
func (m *Manager) railPCI() ([]topology.PCIAddr, bool) {
	rails := m.backends().rails
	out := make([]topology.PCIAddr, len(rails))
	for i, b := range rails {
		a, ok := topology.InfoAddr(&b.Info)
		if !ok {
			return nil, false
		}
		out[i] = a
	}
	return out, true
}

// piece is a part of an op pinned to one rail.
type piece struct {
	spec int // index of its op in the request
	off  uint64
	n    uint64
	rail int
}

// run executes a request: at once when the manager has one rail or
// none; else over the rails. A single op below stripeMin (ReadInto,
// WriteFrom) goes to one rail as it is, without allocating; a failure of
// its rail, or any other request, runs in pieces, in rounds until every
// piece is delivered (runRails).
func (m *Manager) run(ctx context.Context, kind string, ops []opSpec) error {
	bs := m.backends()
	if len(bs.rails) < 2 {
		return m.execute(ctx, kind, ops)
	}
	m.railsBusy()
	defer m.railsIdle()
	if len(ops) != 1 || ops[0].remote.n >= stripeMin {
		return m.runRails(ctx, kind, ops)
	}
	saved := ops[0] // execute takes its references; a redo starts from the op as asked
	o := &ops[0]
	o.pin = m.pickRail(&o.remote, m.nearRails(o.local.st)) + 1 // only a route over the rails looks at it
	err := m.execute(ctx, kind, ops)
	if o.kind != route.Fabric || o.b == nil || o.b.Provider != bs.remote.Provider {
		return err // not over the rails
	}
	rail := o.pin - 1
	if err == nil {
		m.health(rail).bytes.Add(o.remote.n)
		return nil
	}
	if !m.railRedo(ctx, rail, o) {
		return err
	}
	if _, ok := ctx.Deadline(); !ok && !o.deadline.IsZero() {
		// The request's one deadline: the manager's timeout from its
		// first try, not a second one from the redo.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, o.deadline)
		defer cancel()
	}
	ops[0] = saved
	return m.runRails(ctx, kind, ops)
}

// railRedo reports whether o, an op that failed on rail, goes again over
// the other rails: when it failed because of its rail, which it takes
// out of use; not when it failed because of its handle, buffer or owner,
// or its request's deadline or context.
func (m *Manager) railRedo(ctx context.Context, rail int, o *opSpec) bool {
	var we *progress.WedgedError
	if errors.As(o.fail, &we) {
		// Taken out of use, but not redone: its ops may still be
		// posted on an endpoint nothing can close.
		m.railFailed(rail, nil, o.fail)
	}
	if o.fail == nil || !m.railFault(o.fail) || ctx.Err() != nil || pastDeadline(ctx) || !o.deadline.IsZero() && !time.Now().Before(o.deadline) {
		return false // (a context without a deadline had the manager's: o.deadline)
	}
	m.railFailed(rail, o.b, o.fail)
	return true
}

// runRails runs a request over the rails: each op toward an owner reached
// over them cut into pieces (split), in rounds until every piece is
// delivered, the request's deadline passes, or no rail is left.
func (m *Manager) runRails(ctx context.Context, kind string, ops []opSpec) error {
	if err := ctx.Err(); err != nil {
		return notStarted(kind, ops, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		// One deadline for every round of the request.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.timeout)
		defer cancel()
	}
	bs := m.backends()
	var pieces []piece
	railOp := -1 // the first op over the rails: what probes read
	times := reqTimes{ctx: ctx, timeout: m.cfg.timeout, quit: m.quit}
	for i := range ops {
		rt, err := m.route(&ops[i].remote, 1, &times)
		if err != nil || rt.kind != route.Fabric || rt.b.Provider != bs.remote.Provider {
			pieces = append(pieces, piece{spec: i, n: ops[i].remote.n, rail: -1})
			continue
		}
		if railOp < 0 {
			railOp = i
		}
		pieces = m.split(pieces, i, &ops[i], 0, ops[i].remote.n)
	}
	if railOp < 0 {
		// Same-node or other routes only: whether the rails are up is
		// not this request's business.
		return m.execute(ctx, kind, ops)
	}
	for round := 0; ; round++ {
		if m.railsUp() == 0 {
			for r := range bs.rails {
				if time.Now().UnixNano()-m.health(r).probedAt.Load() > int64(railProbeEvery) {
					m.probeRail(r, ops[railOp].remote) // for the requests after this one
				}
			}
			return fmt.Errorf("%w: every one of the %d %s rails failed (%s)", ErrNoRail, len(bs.rails), bs.remote.Provider, m.railErrors())
		}
		redo, err := m.runRound(ctx, kind, ops, pieces)
		if err == nil {
			return nil
		}
		if redo == nil || ctx.Err() != nil {
			return err
		}
		if m.railsUp() == 0 {
			return fmt.Errorf("%w: every one of the %d %s rails failed (%s): %w", ErrNoRail, len(bs.rails), bs.remote.Provider, m.railErrors(), err)
		}
		if round > 2*len(bs.rails)+2 {
			return err
		}
		pieces = pieces[:0]
		for _, p := range redo {
			pieces = m.split(pieces, p.spec, &ops[p.spec], p.off, p.n)
		}
	}
}

// runRound runs the pieces once. It returns nil when all were delivered;
// else the request's error and, when every failed piece failed because of
// its rail (which is then taken out of use), the pieces to run again.
// Meanwhile watchRails takes a rail that stopped completing ops out of
// use, which ends that rail's pieces.
func (m *Manager) runRound(ctx context.Context, kind string, ops []opSpec, pieces []piece) ([]piece, error) {
	specs := make([]opSpec, len(pieces))
	perRail := map[int]uint64{}
	for i, p := range pieces {
		o := &ops[p.spec]
		specs[i] = opSpec{op: o.op, local: view{o.local.st, o.local.off + p.off, p.n}, remote: o.remote, sourceFree: o.sourceFree}
		specs[i].remote.off += p.off
		specs[i].remote.n = p.n
		if p.rail >= 0 {
			specs[i].pin = p.rail + 1
			perRail[p.rail] += p.n
		}
	}
	for r, n := range perRail {
		m.health(r).queued.Add(int64(n))
	}
	start := time.Now()
	err := m.execute(ctx, kind, specs)
	took := time.Since(start)
	for r, n := range perRail {
		m.health(r).queued.Add(-int64(n))
	}
	var redo []piece
	hard, told := false, false
	for i, p := range pieces {
		s := &specs[i]
		told = told || s.fail != nil
		if p.rail < 0 {
			// A whole op's failure may not be on record (cma, mem):
			// any failure of the request then ends it.
			hard = hard || err != nil
			continue
		}
		h := m.health(p.rail)
		if s.fail == nil {
			h.bytes.Add(p.n)
			if p.n >= stripeAlign && took > 0 {
				seen := float64(perRail[p.rail]) / took.Seconds()
				if old := math.Float64frombits(h.rate.Load()); old > 0 {
					seen = (old + seen) / 2
				}
				h.rate.Store(math.Float64bits(seen))
			}
			continue
		}
		if !m.railRedo(ctx, p.rail, s) {
			hard = true
			continue
		}
		redo = append(redo, p)
	}
	if err == nil {
		return nil, nil
	}
	if hard || !told {
		return nil, err
	}
	return redo, err
}

// railsBusy and railsIdle count the requests running over the rails:
// watchRails samples them only while there is one.
func (m *Manager) railsBusy() {
	if m.railsActive.Add(1) == 1 {
		select {
		case m.railsWake <- struct{}{}:
		default:
		}
	}
}

func (m *Manager) railsIdle() { m.railsActive.Add(-1) }

// watchRails runs for the manager's life when it has two rails or more.
// While requests run over the rails it samples every rail up every
// railWatchEvery: one whose endpoint has ops out and completed none for
// stallAfter is taken out of use (railFailed closes its endpoint, which
// fails its pieces). Idle, it waits for railsBusy.
func (m *Manager) watchRails() {
	type watch struct {
		b     *libfabric.Route
		last  uint64
		since time.Time
	}
	ws := make([]watch, len(m.backends().rails))
	tick := time.NewTicker(railWatchEvery)
	defer tick.Stop()
	for {
		if m.railsActive.Load() == 0 {
			tick.Stop()
			select {
			case <-m.railsWake:
			case <-m.railsStop:
				return
			}
			tick.Reset(railWatchEvery)
			clear(ws) // an idle spell is no stall
		}
		var now time.Time
		select {
		case <-m.railsStop:
			return
		case now = <-tick.C:
		}
		for r, b := range m.backends().rails {
			w := &ws[r]
			posted, completed := b.Activity()
			switch {
			case w.b != b || completed != w.last || posted == completed || m.health(r).down.Load():
				// A new endpoint, progress, nothing out, or a rail
				// already out of use (its probe may be out).
				*w = watch{b: b, last: completed, since: now}
			case now.Sub(w.since) > m.stallAfter(r, b):
				m.railFailed(r, b, fmt.Errorf("%w: rail %d (%s) completed none of its %d ops in flight for %v",
					ErrTimeout, r, b.Info.Domain.Name, posted-completed, now.Sub(w.since).Round(time.Millisecond)))
				w.since = now
			}
		}
	}
}

// stallAfter is how long rail r may complete nothing while it has ops
// out: railStallFloor plus railStallFactor times one op of the size its
// endpoint takes at the rate the rail showed.
func (m *Manager) stallAfter(r int, b *libfabric.Route) time.Duration {
	return railStallFloor + time.Duration(railStallFactor*float64(b.Chunk)/m.health(r).bytesPerSecond()*float64(time.Second))
}

// pastDeadline reports whether ctx's deadline has come: the progress
// loop may expire a job on its own clock a moment before ctx says so,
// and that timeout is the request's, not its rail's.
func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// railFault reports whether an op's error is its rail's, not its handle's,
// buffer's or owner's: another rail may then deliver the piece. A closed
// endpoint is the rail's while the manager is open (another request took
// a stalled rail's endpoint out of use under this one).
func (m *Manager) railFault(err error) bool {
	if errors.Is(err, ErrClosed) || errors.Is(err, progress.ErrClosed) {
		return !m.down.Load()
	}
	var we *progress.WedgedError
	if errors.As(err, &we) {
		// Its ops may still be posted, and nothing can end them: the
		// request must not return nil.
		return false
	}
	for _, final := range []error{ErrPeerGone, ErrStaleHandle, ErrAccessDenied, ErrOutOfRange, ErrBadHandle,
		ErrBufferClosed, ErrTooSmall, ErrNoRoute, ErrForeignBuffer, ErrDeviceMemory, context.Canceled} {
		if errors.Is(err, final) {
			return false
		}
	}
	return true
}

// split appends the pieces of bytes [off, off+n) of op i: one, on the rail
// pickRail chooses, below stripeMin; else one per rail up, sized so that
// each rail's queue
// — what it has in flight plus its piece — is in proportion to its speed.
func (m *Manager) split(out []piece, i int, o *opSpec, off, n uint64) []piece {
	bs := m.backends()
	var up []int
	for r := range bs.rails {
		h := m.health(r)
		if !h.down.Load() {
			up = append(up, r)
			continue
		}
		if time.Now().UnixNano()-h.probedAt.Load() > int64(railProbeEvery) {
			m.probeRail(r, o.remote)
		}
	}
	if len(up) == 0 {
		// Nothing up: the owner's rail, to fail or (after a repair) to
		// bring the rail back.
		return append(out, piece{spec: i, off: off, n: n, rail: m.pickRail(&o.remote, nil)})
	}
	if n < stripeMin || len(up) == 1 {
		r := up[0]
		if len(up) > 1 {
			r = m.pickRail(&o.remote, m.nearRails(o.local.st))
		}
		return append(out, piece{spec: i, off: off, n: n, rail: r})
	}
	weight := make([]float64, len(up))
	var wsum, queued float64
	for k, r := range up {
		weight[k] = 1
		if nic := bs.rails[r].Info.NIC; nic != nil && nic.Link != nil && nic.Link.Speed > 0 {
			weight[k] = float64(nic.Link.Speed)
		}
		wsum += weight[k]
		queued += float64(m.health(r).queued.Load())
	}
	// Water-filling: each rail's share of everything queued plus this op,
	// less what it has queued already.
	share := make([]float64, len(up))
	var ssum float64
	for k, r := range up {
		share[k] = max(0, (queued+float64(n))*weight[k]/wsum-float64(m.health(r).queued.Load()))
		ssum += share[k]
	}
	at := off
	for k, r := range up {
		var size uint64
		if k == len(up)-1 {
			size = off + n - at
		} else {
			size = uint64(float64(n)*share[k]/ssum) / stripeAlign * stripeAlign
			size = min(size, off+n-at)
		}
		if size == 0 {
			continue
		}
		out = append(out, piece{spec: i, off: at, n: size, rail: r})
		at += size
	}
	return out
}

// railsUp counts the rails in use.
func (m *Manager) railsUp() int {
	up := 0
	for i := range m.backends().rails {
		if !m.health(i).down.Load() {
			up++
		}
	}
	return up
}

// railErrors lists why each rail is down.
func (m *Manager) railErrors() string {
	var out []string
	for i, b := range m.backends().rails {
		if p := m.health(i).lastError.Load(); p != nil {
			out = append(out, fmt.Sprintf("rail %d (%s): %s", i, b.Info.Domain.Name, *p))
		}
	}
	return strings.Join(out, "; ")
}

// probeRail probes rail i, which is down, in the background: it reads
// the first bytes of r (a buffer a transfer is about to use) over the
// rail into the manager's probe buffer — so that a late completion lands
// there, never in a buffer of the user's — within the rail's stall
// time. The rail is back in use when the read goes through. Buffers
// peers may not read are not probed with.
func (m *Manager) probeRail(i int, r RemoteBuffer) {
	h := m.health(i)
	if !r.access.Allows(mr.RemoteRead) || r.n == 0 || !h.probing.CompareAndSwap(false, true) {
		return
	}
	h.probedAt.Store(time.Now().UnixNano())
	go func() {
		defer h.probing.Store(false)
		m.probeOnce.Do(func() {
			m.probeBuf, m.probeErr = m.Alloc(probeSize, 0)
			if m.probeErr == nil {
				// Its probes are left in flight on a stalled rail on
				// purpose; their bytes matter to no one.
				m.probeBuf.st.unguarded = true
			}
		})
		if m.probeErr != nil {
			return
		}
		b := m.backends().rails[i]
		ctx, cancel := context.WithTimeout(context.Background(), m.stallAfter(i, b))
		defer cancel()
		src, _ := r.Slice(0, min(r.n, probeSize))
		ops := [1]opSpec{{op: progress.Read, local: view{m.probeBuf.st, 0, src.n}, remote: src, pin: i + 1}}
		err := m.execute(ctx, "probe", ops[:])
		h.probedAt.Store(time.Now().UnixNano())
		switch {
		case err == nil && ops[0].kind == route.Fabric && ops[0].b == b:
			m.railUp(i) // a read that went another way says nothing of the rail
		default:
			// Still down. A probe that stalled is not ended by closing
			// its endpoint: it reads into the probe buffer, which nothing
			// else uses, and replacing endpoints at every probe of a dead
			// link would only pile them up.
		}
	}()
}

// railUp puts rail i back in use after a probe went through it.
func (m *Manager) railUp(i int) {
	if m.health(i).down.CompareAndSwap(true, false) {
		m.log.Info().Int("rail", i).Str("domain", m.backends().rails[i].Info.Domain.Name).Msg("rail back in use: a probe went through")
	}
}

// railFailed takes rail i out of use after a piece failed on it, on its
// endpoint b, with err. A piece that did not end (it stalled) may still
// be in flight there and could write its buffer later: b is then closed,
// which ends whatever it still had, and a new endpoint takes its place
// for the probes.
func (m *Manager) railFailed(i int, b *libfabric.Route, err error) {
	h := m.health(i)
	h.probedAt.Store(time.Now().UnixNano())
	if h.down.CompareAndSwap(false, true) {
		msg := err.Error() // the first error of the spell says why
		h.lastError.Store(&msg)
		h.failures.Add(1)
		m.log.Warn().Int("rail", i).Str("domain", m.backends().rails[i].Info.Domain.Name).Err(err).Msg("rail taken out of use")
	}
	if errors.Is(err, ErrTimeout) && b != nil {
		if rerr := m.replaceRail(b); rerr != nil {
			m.log.Error().Err(rerr).Int("rail", i).Msg("replacing the endpoint of a stalled rail")
		}
	}
}

// replaceRail closes the endpoint of rail old, ending the ops it still
// has, and opens a new one on the same domain in its place.
func (m *Manager) replaceRail(old *libfabric.Route) error {
	if err := m.acquire(); err != nil {
		return nil
	}
	defer m.releaseManager()
	m.replaceMu.Lock()
	defer m.replaceMu.Unlock()
	cur := m.backends()
	if old.Rail >= len(cur.rails) || cur.rails[old.Rail] != old || old.Retired.Load() {
		return nil
	}
	old.Retired.Store(true)
	if n := old.AbortTCP(); n > 0 {
		m.log.Info().Int("rail", old.Rail).Int("sockets", n).Msg("rail's TCP sockets set to abort, not retransmit")
	}
	closeErr := m.closeWithMRs(old)
	next := &backendSet{all: append([]*libfabric.Route(nil), cur.all...), sameNode: cur.sameNode, shmOut: cur.shmOut, indexes: cur.indexes + 1,
		rails: append([]*libfabric.Route(nil), cur.rails...)}
	b, err := m.open(cur.indexes, &old.Info, old.Reason, old.Role)
	if err != nil {
		m.log.Error().Err(err).Int("rail", old.Rail).Msg("no new endpoint for a failed rail; it stays out of use")
		return errors.Join(closeErr, err)
	}
	b.Rail = old.Rail
	next.all = append(next.all, b)
	next.rails[old.Rail] = b
	next.remote = next.rails[0]
	m.set.Store(next)
	return closeErr
}
