package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// CI runs TestIntegrity for -integrity.time; a long hunt sets an op count:
//
//	go test -race -run TestIntegrity ./test -args -integrity.ops 100000
var (
	integrityOps    = flag.Int("integrity.ops", 0, "random ops TestIntegrity runs (an Action or a burst counts as one); 0: run for -integrity.time")
	integrityTime   = flag.Duration("integrity.time", 30*time.Second, "how long TestIntegrity runs random ops when -integrity.ops is 0")
	integrityRoutes = flag.String("integrity.routes", "", "comma-separated routes TestIntegrity uses (memcpy, cma, shm, tcp;ofi_rxm); empty: all")
)

const (
	integrityWorkers = 4
	rwSize           = 4 << 20  // each worker's read-write buffer at each owner, and its reusable local buffer per route
	roSize           = 64 << 10 // each worker's read-only buffer at each owner
	bigSize          = 64 << 20 // the read-only buffer all workers read at each owner
	integrityTimeout = 5 * time.Second
	// hangGrace: how long past its deadline a call may take before the
	// watchdog calls it a hang (a stuck libfabric call is reported as
	// wedged after progress.WedgeAfter).
	hangGrace       = progress.WedgeAfter + 2*time.Second
	shownViolations = 20
	closedKept      = 8 // closed buffers a worker keeps per owner for ops that must fail
)

// TestIntegrity holds the library's first promise under random load:
// a nil error means every byte is where it should be. Workers issue
// random reads, writes and Actions of random sizes and offsets over every
// route (memcpy, cma, shm, tcp;ofi_rxm), with deadlines from already
// expired to long, interleaved with ops that must fail (altered key,
// closed buffer, read-only buffer, out of range). Every nil is checked
// byte for byte (reads against the owner's known pattern, writes by
// asking the owner); every error must be of a documented class. State
// that a failed op leaves unknown — the local buffer, the owner's range
// a write was under way to — is thrown away (closed, waiting for late
// ops) or refilled before it is checked again, so that a violation is
// always the library's. A call that does not return well after its
// deadline is a violation too (a watchdog reports it and leaves its
// worker behind). Nil from an op whose context had ended before it
// started is counted per route, not checked: no promise covers it yet.
func TestIntegrity(t *testing.T) {
	requireRoutes(t, providers...) // a manager and the owners open every route
	setup := time.Now()
	seed := integritySeed(t)
	t.Logf("seed %d (replay the choices with TEST_SEED=%d; timing is not replayed)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	r := &integrityRun{t: t, seed: seed, mgrs: map[string]*transport.Manager{}, mems: map[*byte][]byte{},
		stats: map[string]map[string]int{}, nilEnded: map[string]int{}, down: map[string]bool{}}
	t.Cleanup(r.cleanup)

	r.routes = integrityRouteList(t)
	var err error
	// The memcpy manager also owns the self buffers: always open.
	r.mgrs["memcpy"], err = transport.New(context.Background(), transport.WithTimeout(integrityTimeout))
	require.NoError(t, err)
	for _, p := range providers {
		r.mgrs[p], err = transport.New(context.Background(), transport.WithProviders(p), transport.WithTimeout(integrityTimeout))
		require.NoError(t, err)
	}
	// Two child owners, each reachable over every route but memcpy, and
	// this process's own memcpy manager as the third.
	for i := 0; i < 2; i++ {
		r.owners = append(r.owners, &peerOwner{label: "peer" + strconv.Itoa(i), over: &r.over, p: testpeer.Start(t, providers...)})
	}
	r.self = len(r.owners)
	r.owners = append(r.owners, &selfOwner{r: r, m: r.mgrs["memcpy"]})

	bigSeed := rng.Uint64()
	r.bigShadow = testpeer.Pattern(bigSize, bigSeed)
	r.pool = testpeer.Pattern(2*rwSize, rng.Uint64())
	r.poison = testpeer.Pattern(rwSize, rng.Uint64())
	for _, o := range r.owners {
		h, idx, err := o.register(bigSize, mr.RemoteRead, bigSeed)
		require.NoError(t, err)
		r.big = append(r.big, ownedBuf{o: o, idx: idx, h: h, pattern: r.bigShadow})
	}

	workers := make([]*worker, integrityWorkers)
	for i := range workers {
		w := &worker{r: r, id: i, rng: rand.New(rand.NewPCG(seed, uint64(i+1))), locals: map[string]*local{}}
		for _, o := range r.owners {
			s := w.rng.Uint64()
			h, idx, err := o.register(rwSize, mr.ReadWrite, s)
			require.NoError(t, err)
			tg := &target{o: o, idx: idx, h: h, shadow: testpeer.Pattern(rwSize, s)}
			tg.badKey, err = rekey(h)
			require.NoError(t, err)
			w.rw = append(w.rw, tg)

			s = w.rng.Uint64()
			h, idx, err = o.register(roSize, mr.RemoteRead, s)
			require.NoError(t, err)
			ro := &roBuf{ownedBuf: ownedBuf{o: o, idx: idx, h: h, pattern: testpeer.Pattern(roSize, s)}}
			ro.forged, err = rewrite(h, func(top map[string]any, _ []map[string]any) {
				top["access"] = []string{"remote_read", "remote_write"}
			})
			require.NoError(t, err)
			ro.long, err = rewrite(h, func(top map[string]any, _ []map[string]any) {
				set(top, "length", num(top["length"])+roSize)
				set(top, "size", num(top["size"])+roSize)
			})
			require.NoError(t, err)
			w.ro = append(w.ro, ro)
			w.closed = append(w.closed, nil)
		}
		for _, route := range r.routes {
			l, err := r.newLocal(r.mgrs[route], rwSize)
			require.NoError(t, err)
			w.locals[route] = l
		}
		workers[i] = w
	}
	// Every route is the one its manager takes, and works, before the
	// random ops start.
	for _, route := range r.routes {
		m := r.mgrs[route]
		for _, oi := range r.ownersOf(route) {
			h := workers[0].rw[oi].h
			got, err := m.Route(h)
			require.NoError(t, err)
			require.Equal(t, route, got.Backend, "route to %s", r.owners[oi].name())
			require.NoError(t, m.ReadInto(context.Background(), workers[0].locals[route].b, h), "%s to %s", route, r.owners[oi].name())
		}
	}

	start := time.Now()
	t.Logf("set up in %v; running %d workers over %v", start.Sub(setup).Round(time.Millisecond), integrityWorkers, r.routes)
	r.end = start.Add(*integrityTime)
	r.left.Store(int64(*integrityOps))
	stopped := make(chan *worker, len(workers))
	for _, w := range workers {
		go func() {
			defer func() { stopped <- w }()
			for r.claim() && w.step() {
			}
			for _, tg := range w.rw {
				w.settle(tg) // late ops done before the report
			}
		}()
	}
	r.watch(workers, stopped)
	r.over.Store(true)
	ran := time.Since(start)
	r.waitRetired()
	r.report(ran)
}

// watch waits for the workers; one whose call has not returned hangGrace
// after its deadline is reported and left behind, so that a hang in the
// library fails the test instead of stalling it.
func (r *integrityRun) watch(workers []*worker, stopped <-chan *worker) {
	left := map[*worker]bool{}
	for _, w := range workers {
		left[w] = true
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for len(left) > 0 {
		select {
		case w := <-stopped:
			delete(left, w)
		case <-tick.C:
			r.checkOwners()
			for w := range left {
				if what, over := w.overdue(); over {
					r.abandoned.Store(true)
					r.violation(fmt.Sprintf("HANG (worker %d) %s: did not return %v after its deadline", w.id, what, hangGrace))
					delete(left, w)
				}
			}
		}
	}
}

// checkOwners stops the run once an owner process is gone: nothing in
// the run ends them, so something outside it did (or they crashed), and
// what follows — ops toward a dead owner, shm endpoints stuck on its
// region lock — is not the invariant under test. It is reported as such.
func (r *integrityRun) checkOwners() {
	for _, ow := range r.owners {
		o, ok := ow.(*peerOwner)
		if !ok {
			continue // this process
		}
		if gone, why := proc.Gone(o.p.Pid); gone && !o.gone.Swap(true) {
			r.violation(fmt.Sprintf("OWNER GONE: %s (%s) during the run; the run stops, its later errors follow from that", o.label, why))
			r.stopClaims.Store(true)
		}
	}
}

// waitRetired waits for the buffers being closed: Close waits for ops in
// flight up to the manager's timeout, then returns.
func (r *integrityRun) waitRetired() {
	end := time.Now().Add(integrityTimeout + hangGrace)
	for r.retiring.Load() > 0 {
		if time.Now().After(end) {
			r.abandoned.Store(true)
			r.violation(fmt.Sprintf("HANG: %d Buffer.Close calls did not return %v after the manager's timeout", r.retiring.Load(), hangGrace))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// integrityRouteList is the routes ops take: "memcpy" and the providers,
// or those -integrity.routes names.
func integrityRouteList(t *testing.T) []string {
	all := append([]string{"memcpy"}, providers...)
	if *integrityRoutes == "" {
		return all
	}
	var out []string
	for _, r := range strings.Split(*integrityRoutes, ",") {
		require.Contains(t, all, r, "-integrity.routes")
		out = append(out, r)
	}
	return out
}

// integritySeed is TEST_SEED when set, else the clock.
func integritySeed(t *testing.T) uint64 {
	if s := os.Getenv("TEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "TEST_SEED")
		return v
	}
	return uint64(time.Now().UnixNano())
}

// classify sorts an op's error into the documented classes; "other" is
// an error the library does not document for that op. Kept in one place
// so that it can move to the ErrPeerGone/ErrTimeout sentinels.
func classify(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, transport.ErrStaleHandle), errors.Is(err, transport.ErrBadHandle):
		return "stale"
	case errors.Is(err, transport.ErrAccessDenied):
		return "access"
	case errors.Is(err, transport.ErrOutOfRange), errors.Is(err, transport.ErrTooSmall):
		return "range"
	case errors.Is(err, transport.ErrBufferClosed), errors.Is(err, transport.ErrClosed):
		return "closed"
	case errors.Is(err, transport.ErrTimeout), errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return "timeout"
	case errors.Is(err, transport.ErrPeerGone):
		return "peer-gone"
	case transport.Retryable(err):
		return "retryable"
	}
	return "other"
}

// integrityRun is what the workers share.
type integrityRun struct {
	t         *testing.T
	seed      uint64
	routes    []string // the routes ops take
	mgrs      map[string]*transport.Manager
	owners    []owner // the peers, then this process (self)
	self      int
	big       []ownedBuf // per owner, read-only, bigShadow
	bigShadow []byte
	pool      []byte // random bytes that writes copy from
	poison    []byte // what a reusable local buffer holds before a read

	end  time.Time
	left atomic.Int64

	retiring   atomic.Int64 // Close calls under way
	abandoned  atomic.Bool  // a worker or a Close hangs: its memory may still be used
	over       atomic.Bool  // the workers were waited for: a late one must not touch t
	stopClaims atomic.Bool  // no more ops: an owner is gone
	memMu      sync.Mutex
	mems       map[*byte][]byte // every mr.Alloc not yet freed

	mu         sync.Mutex
	down       map[string]bool           // routes whose manager cannot register any more
	stats      map[string]map[string]int // route → "kind class" → count
	nilEnded   map[string]int            // route → nil from ops whose context had ended before they started
	violations []string
}

// claim says whether a worker runs one more step.
func (r *integrityRun) claim() bool {
	if r.over.Load() || r.stopClaims.Load() {
		return false
	}
	if *integrityOps > 0 {
		return r.left.Add(-1) >= 0
	}
	return time.Now().Before(r.end)
}

func (r *integrityRun) ownersOf(route string) []int {
	if route == "memcpy" {
		return []int{r.self}
	}
	out := make([]int, 0, r.self)
	for i := 0; i < r.self; i++ {
		out = append(out, i)
	}
	return out
}

func (r *integrityRun) alloc(n int) ([]byte, error) {
	mem, err := mr.Alloc(n)
	if err != nil {
		return nil, err
	}
	r.memMu.Lock()
	r.mems[&mem[0]] = mem
	r.memMu.Unlock()
	return mem, nil
}

func (r *integrityRun) free(mem []byte) {
	r.memMu.Lock()
	delete(r.mems, &mem[0])
	r.memMu.Unlock()
	_ = mr.Free(mem)
}

// cleanup closes the managers, then frees the memory: buffers whose
// Close returned an *InUseError may be in use until Manager.Close. Memory
// that a hung call may still use stays mapped.
func (r *integrityRun) cleanup() {
	closed := make(chan struct{})
	go func() {
		for _, m := range r.mgrs {
			_ = m.Close()
		}
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(integrityTimeout + hangGrace):
		r.t.Errorf("the managers did not close within %v (seed %d; replay with TEST_SEED=%d)", integrityTimeout+hangGrace, r.seed, r.seed)
		return
	}
	if r.abandoned.Load() {
		return
	}
	r.memMu.Lock()
	defer r.memMu.Unlock()
	for _, mem := range r.mems {
		_ = mr.Free(mem)
	}
	r.mems = nil
}

// local is a buffer of one manager that ops read into and write from.
type local struct {
	b   *transport.Buffer
	mem []byte
}

func (r *integrityRun) newLocal(m *transport.Manager, n int) (*local, error) {
	mem, err := r.alloc(n)
	if err != nil {
		return nil, err
	}
	b, err := m.Register(mem, mr.ReadWrite)
	if err != nil {
		r.free(mem)
		return nil, err
	}
	return &local{b: b, mem: mem}, nil
}

// settlement is the end of a retired local buffer's use: Close's error
// once no op of an earlier transfer uses it any more (nil), or once Close
// gave up waiting (an *InUseError: its ops may still land). Several
// targets may wait for one.
type settlement struct {
	once sync.Once
	ch   <-chan error
	err  error
}

func (s *settlement) wait() error {
	s.once.Do(func() { s.err = <-s.ch })
	return s.err
}

// retire closes l in the background. Its memory is freed once Close
// returns nil, or kept until the managers close.
func (r *integrityRun) retire(l *local) *settlement {
	done := make(chan error, 1)
	r.retiring.Add(1)
	go func() {
		defer r.retiring.Add(-1)
		err := l.b.Close()
		if err == nil {
			r.free(l.mem)
		}
		done <- err
	}()
	return &settlement{ch: done}
}

// owner is where buffers live: a child process or this one. Its methods
// are safe for concurrent use.
type owner interface {
	name() string
	register(size int, access mr.Access, seed uint64) (transport.RemoteBuffer, int, error)
	sum(buf int, off, n uint64) string
	fill(buf int, seed uint64)
	closeBuf(buf int)
}

// peerOwner serializes a testpeer's line protocol and numbers its buffers.
type peerOwner struct {
	label string
	gone  atomic.Bool // its process was found gone (checkOwners)
	over  *atomic.Bool
	mu    sync.Mutex
	p     *testpeer.Peer
	n     int
}

// lock takes the peer; a worker left behind by the watchdog that comes
// back after the test ended stops here: the peer fails through t.
func (o *peerOwner) lock() {
	if o.over.Load() {
		runtime.Goexit()
	}
	o.mu.Lock()
}

func (o *peerOwner) name() string { return o.label }

func (o *peerOwner) register(size int, access mr.Access, seed uint64) (transport.RemoteBuffer, int, error) {
	o.lock()
	defer o.mu.Unlock()
	h, err := o.p.TryRegister(size, access, seed)
	if err != nil {
		return h, 0, err
	}
	o.n++
	return h, o.n - 1, nil
}

func (o *peerOwner) sum(buf int, off, n uint64) string {
	o.lock()
	defer o.mu.Unlock()
	return o.p.Sum(buf, off, n)
}

func (o *peerOwner) fill(buf int, seed uint64) {
	o.lock()
	defer o.mu.Unlock()
	o.p.FillBuf(buf, seed)
}

func (o *peerOwner) closeBuf(buf int) {
	o.lock()
	defer o.mu.Unlock()
	o.p.CloseBuf(buf)
}

// selfOwner owns buffers in the memcpy manager: ops of that manager with
// their handles are same-manager copies.
type selfOwner struct {
	r    *integrityRun
	m    *transport.Manager
	mu   sync.Mutex
	bufs []*transport.Buffer
}

func (o *selfOwner) name() string { return "self" }

func (o *selfOwner) register(size int, access mr.Access, seed uint64) (transport.RemoteBuffer, int, error) {
	mem, err := o.r.alloc(size)
	if err != nil {
		return transport.RemoteBuffer{}, 0, err
	}
	testpeer.Fill(mem, seed)
	b, err := o.m.Register(mem, access)
	if err != nil {
		o.r.free(mem)
		return transport.RemoteBuffer{}, 0, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bufs = append(o.bufs, b)
	return b.Remote(), len(o.bufs) - 1, nil
}

func (o *selfOwner) buf(i int) *transport.Buffer {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bufs[i]
}

func (o *selfOwner) sum(buf int, off, n uint64) string {
	return testpeer.Sum(o.buf(buf).Bytes()[off : off+n])
}

func (o *selfOwner) fill(buf int, seed uint64) { testpeer.Fill(o.buf(buf).Bytes(), seed) }

// closeBuf closes the registration and keeps the memory (freed at the
// end), so that its bytes can still be compared.
func (o *selfOwner) closeBuf(buf int) { _ = o.buf(buf).Close() }

// ownedBuf is a buffer at an owner whose bytes do not change (read-only,
// or closed): pattern is what it holds.
type ownedBuf struct {
	o       owner
	idx     int
	h       transport.RemoteBuffer
	pattern []byte
}

// roBuf is a worker's read-only buffer, with handles altered to grant
// write (forged) and to reach past its end (long).
type roBuf struct {
	ownedBuf
	forged, long transport.RemoteBuffer
}

// target is a worker's read-write buffer at one owner; only that worker
// uses it. shadow is what it holds, unless pending: a retired local
// buffer whose failed writes to it may still land.
type target struct {
	o       owner
	idx     int
	h       transport.RemoteBuffer
	badKey  transport.RemoteBuffer
	shadow  []byte
	pending *settlement
}

// rewrite changes a handle through its JSON form, like alter, but
// returns its errors: workers call it.
func rewrite(h transport.RemoteBuffer, fn func(top map[string]any, eps []map[string]any)) (transport.RemoteBuffer, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return transport.RemoteBuffer{}, err
	}
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		return transport.RemoteBuffer{}, err
	}
	var eps []map[string]any
	for _, e := range top["endpoints"].([]any) {
		eps = append(eps, e.(map[string]any))
	}
	fn(top, eps)
	if b, err = json.Marshal(top); err != nil {
		return transport.RemoteBuffer{}, err
	}
	var out transport.RemoteBuffer
	return out, json.Unmarshal(b, &out)
}

// rekey is h with every endpoint's key altered.
func rekey(h transport.RemoteBuffer) (transport.RemoteBuffer, error) {
	return rewrite(h, func(_ map[string]any, eps []map[string]any) {
		for _, e := range eps {
			set(e, "key", num(e["key"])^0xdead)
		}
	})
}

// worker issues random ops; it owns its targets, read-only buffers and
// local buffers, so that nothing it checks is written by another.
type worker struct {
	r      *integrityRun
	id     int
	rng    *rand.Rand
	rw     []*target    // per owner
	ro     []*roBuf     // per owner
	closed [][]ownedBuf // per owner: buffers the owner closed
	locals map[string]*local

	mu    sync.Mutex // the call under way, for the watchdog
	what  func() string
	until time.Time
}

// busy records a call that must return within limit; the returned func
// ends it.
func (w *worker) busy(what func() string, limit time.Duration) func() {
	w.mu.Lock()
	w.what, w.until = what, time.Now().Add(limit)
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.what = nil
		w.mu.Unlock()
	}
}

// overdue describes the call under way when it is past its limit.
func (w *worker) overdue() (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.what == nil || time.Now().Before(w.until) {
		return "", false
	}
	return w.what(), true
}

// newLocal registers a local buffer for route; when that fails, the
// route is down (reported once) and the step ends.
func (w *worker) newLocal(route string, n int) *local {
	defer w.busy(func() string { return "registering a local buffer over " + route }, hangGrace)()
	l, err := w.r.newLocal(w.r.mgrs[route], n)
	if err != nil {
		r := w.r
		r.mu.Lock()
		first := !r.down[route]
		r.down[route] = true
		r.mu.Unlock()
		if first {
			r.violation(fmt.Sprintf("ROUTE DOWN (worker %d) %s: registering a local buffer failed, the route is not used any more: %v", w.id, route, err))
		}
		panic(routeDown{})
	}
	return l
}

// routeDown ends a step whose route went down.
type routeDown struct{}

// deadline is how an op's context ends.
type deadline struct {
	desc  string
	at    time.Time // zero: none (the manager's timeout), or canceled
	none  bool
	ended bool // before the op started
}

// op describes one transfer for the counts and the violation reports.
type op struct {
	kind, route string
	owner       string
	size        uint64
	roff, loff  uint64
	fresh       bool // into or from a newly registered local buffer
	dl          deadline
	start       time.Time
	took        time.Duration
	ctxErr      error
}

func (o *op) String() string {
	local := "reused"
	if o.fresh {
		local = "new"
	}
	took := "took " + o.took.String()
	if o.took == 0 {
		took = "running for " + time.Since(o.start).Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%s over %s with %s: %d bytes at remote offset %d, %s local buffer offset %d, deadline %s, %s",
		o.kind, o.route, o.owner, o.size, o.roff, local, o.loff, o.dl.desc, took)
}

// expired: the op's context ended or its deadline passed by its return.
func (o *op) expired() bool {
	switch {
	case o.ctxErr != nil:
		return true
	case o.dl.none:
		return o.took >= integrityTimeout
	case !o.dl.at.IsZero():
		return !o.start.Add(o.took).Before(o.dl.at)
	}
	return false
}

func logUniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return time.Duration(float64(lo) * math.Pow(float64(hi)/float64(lo), rng.Float64()))
}

// pickDeadline: already expired, already canceled, short enough to end
// mid-transfer, or long.
func (w *worker) pickDeadline() (context.Context, context.CancelFunc, deadline) {
	now := time.Now()
	switch k := w.rng.IntN(100); {
	case k < 8:
		at := now.Add(-time.Duration(1+w.rng.IntN(1000)) * time.Microsecond)
		ctx, cancel := context.WithDeadline(context.Background(), at)
		return ctx, cancel, deadline{desc: "expired " + now.Sub(at).String() + " ago", at: at, ended: true}
	case k < 13:
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return ctx, cancel, deadline{desc: "canceled", ended: true}
	case k < 35:
		return w.within(logUniform(w.rng, time.Microsecond, 5*time.Millisecond))
	case k < 47:
		return w.within(logUniform(w.rng, 5*time.Millisecond, 500*time.Millisecond))
	case k < 75:
		return w.within(5 * time.Second)
	}
	return context.Background(), func() {}, deadline{desc: "none (" + integrityTimeout.String() + ")", none: true}
}

func (w *worker) within(d time.Duration) (context.Context, context.CancelFunc, deadline) {
	at := time.Now().Add(d)
	ctx, cancel := context.WithDeadline(context.Background(), at)
	return ctx, cancel, deadline{desc: d.String(), at: at}
}

// size is 1 B .. max, spread over the powers of two.
func (w *worker) size(max uint64) uint64 {
	return 1 + w.rng.Uint64N(min(max, 1<<uint(w.rng.IntN(23))))
}

// pickRoute picks a route that is up ("" when none is); tcp;ofi_rxm,
// where jobs wait in the progress loop's inbox behind others, gets twice
// its share.
func (w *worker) pickRoute() string {
	r := w.r
	r.mu.Lock()
	defer r.mu.Unlock()
	var up []string
	for _, route := range r.routes {
		if !r.down[route] {
			up = append(up, route)
			if route == "tcp;ofi_rxm" {
				up = append(up, route)
			}
		}
	}
	if len(up) == 0 {
		return ""
	}
	return up[w.rng.IntN(len(up))]
}

func (w *worker) pickOwner(route string) int {
	owners := w.r.ownersOf(route)
	return owners[w.rng.IntN(len(owners))]
}

// step runs one random op (or a burst, or an Action); false when no
// route is up any more.
func (w *worker) step() (more bool) {
	route := w.pickRoute()
	if route == "" {
		return false
	}
	defer func() {
		if e := recover(); e != nil {
			if _, ok := e.(routeDown); !ok {
				panic(e)
			}
			more = true // the other routes go on
		}
	}()
	oi := w.pickOwner(route)
	switch k := w.rng.IntN(100); {
	case k < 28:
		w.read(route, oi)
	case k < 50:
		w.write(route, oi)
	case k < 60:
		w.action(route)
	case k < 66:
		w.badKey(route, oi)
	case k < 70:
		w.onClosed(route, oi)
	case k < 74:
		w.readOnlyWrite(route, oi)
	case k < 78:
		w.outOfRange(route, oi)
	case k < 80:
		w.bigRead(route, oi, false)
	default:
		if route == "tcp;ofi_rxm" {
			w.burst(oi)
		} else {
			w.read(route, oi)
		}
	}
	return true
}

// localFor returns the local buffer an op of n bytes uses — the route's
// reusable one at a random offset, poisoned, or sometimes a new one — and
// its offset.
func (w *worker) localFor(route string, n uint64) (*local, *transport.Buffer, uint64, bool) {
	if w.rng.IntN(4) == 0 {
		extra := w.rng.Uint64N(4096)
		l := w.newLocal(route, int(n+extra))
		b, _ := l.b.Slice(extra, n)
		return l, b, extra, true
	}
	l := w.locals[route]
	off := w.rng.Uint64N(rwSize - n + 1)
	b, _ := l.b.Slice(off, n)
	return l, b, off, false
}

// done ends a local buffer's use by an op: a new one, or one that a
// failed op may still use, is retired (and the route gets a new reusable
// one). The settlement says when the retired buffer is settled; nil when
// it was not retired.
func (w *worker) done(route string, l *local, fresh, tainted bool) *settlement {
	if !fresh && !tainted {
		return nil
	}
	ch := w.r.retire(l)
	if !fresh {
		w.locals[route] = w.newLocal(route, rwSize)
	}
	return ch
}

// settle makes a target's content known again after failed writes: once
// the local buffer they used is settled, the owner refills it; if ops
// may still land, the worker registers a new buffer instead.
func (w *worker) settle(tg *target) {
	if tg.pending == nil {
		return
	}
	end := w.busy(func() string { return "waiting for a retired local buffer's Close" }, integrityTimeout+hangGrace)
	err := tg.pending.wait()
	end()
	tg.pending = nil
	if err != nil {
		h, idx, rerr := tg.o.register(rwSize, mr.ReadWrite, 0)
		w.must(rerr, "register a new target")
		bad, rerr := rekey(h)
		w.must(rerr, "alter a handle")
		tg.h, tg.idx, tg.badKey = h, idx, bad
	}
	s := w.rng.Uint64()
	tg.o.fill(tg.idx, s)
	testpeer.Fill(tg.shadow, s)
}

// must ends the worker (not the test, which reports) on a setup error.
func (w *worker) must(err error, what string) {
	if err != nil {
		if !w.r.over.Load() {
			w.r.t.Errorf("worker %d: %s: %v (seed %d; replay with TEST_SEED=%d)", w.id, what, err, w.r.seed, w.r.seed)
		}
		runtime.Goexit()
	}
}

// run times f under a fresh deadline and records it in o.
func (w *worker) run(o *op, f func(ctx context.Context) error) error {
	ctx, cancel, dl := w.pickDeadline()
	defer cancel()
	return w.runWith(ctx, o, dl, f)
}

func (w *worker) runWith(ctx context.Context, o *op, dl deadline, f func(ctx context.Context) error) error {
	o.dl = dl
	o.start = time.Now()
	limit := hangGrace
	switch {
	case dl.none:
		limit += integrityTimeout
	case !dl.at.IsZero():
		limit += max(0, dl.at.Sub(o.start))
	}
	end := w.busy(o.String, limit)
	err := f(ctx)
	end()
	o.took = time.Since(o.start)
	o.ctxErr = ctx.Err()
	return err
}

// outcome counts the op and checks its error: nil for an op that must
// fail, or an undocumented error for an op that should have succeeded
// within its deadline, is a violation.
func (w *worker) outcome(o *op, err error, mustFail bool) {
	class := classify(err)
	r := w.r
	r.mu.Lock()
	if r.stats[o.route] == nil {
		r.stats[o.route] = map[string]int{}
	}
	r.stats[o.route][o.kind+" "+class]++
	if err == nil && o.dl.ended {
		r.nilEnded[o.route]++
	}
	r.mu.Unlock()
	switch {
	case err == nil && mustFail:
		w.violate(o, "returned nil; it must fail")
	case err == nil && o.dl.ended:
		w.violate(o, "returned nil with a context that had ended before the call: it must fail before anything moves")
	case err != nil && o.dl.ended && class != "timeout" && !mustFail:
		w.violate(o, "with a context that had ended before the call, the error is not the context's: %v", err)
	case err != nil && !mustFail && class == "other" && !o.expired():
		w.violate(o, "error outside the documented classes before its deadline: %v", err)
	}
}

func (w *worker) violate(o *op, format string, args ...any) {
	w.r.violation(fmt.Sprintf("VIOLATION (worker %d) %s: %s", w.id, o, fmt.Sprintf(format, args...)))
}

// violation records one, with the seed, and logs the first ones at once.
func (r *integrityRun) violation(msg string) {
	msg = fmt.Sprintf("%s; seed %d, replay with TEST_SEED=%d", msg, r.seed, r.seed)
	r.mu.Lock()
	r.violations = append(r.violations, msg)
	n := len(r.violations)
	r.mu.Unlock()
	if n <= shownViolations && !r.over.Load() {
		r.t.Log(msg)
	}
}

// moved: the op went to a provider or a copy; an error without a
// *TransferError refused it before anything moved.
func moved(err error) bool {
	var te *transport.TransferError
	return errors.As(err, &te)
}

// checkRead checks a nil read's bytes; it reports whether the local
// buffer's content is unknown (a failed or wrong read).
func (w *worker) checkRead(o *op, dst *transport.Buffer, want []byte, err error, mustFail bool) bool {
	w.outcome(o, err, mustFail)
	if err != nil {
		return moved(err)
	}
	if mustFail {
		return true
	}
	got := dst.Bytes()
	if !bytes.Equal(got, want) {
		w.violate(o, "returned nil but the destination is wrong: %s", diff(got, want, w.r.poison[o.loff:], o.fresh))
		return true
	}
	return false
}

// diff describes how got differs from want.
func diff(got, want, poison []byte, fresh bool) string {
	first, n := -1, 0
	for i := range got {
		if got[i] != want[i] {
			if first < 0 {
				first = i
			}
			n++
		}
	}
	untouched := "poisoned"
	if fresh {
		untouched = "zero"
		poison = make([]byte, len(got))
	}
	still := 0
	for i := range got {
		if got[i] == poison[i] {
			still++
		}
	}
	return fmt.Sprintf("%d of %d bytes differ, the first at %d; %d bytes are still %s as before the read", n, len(got), first, still, untouched)
}

// checkWrite checks a nil write at the owner and records it in the
// target's shadow; a failed one leaves the target pending on its local.
func (w *worker) checkWrite(o *op, route string, l *local, tg *target, src []byte, err error, mustFail bool) {
	w.outcome(o, err, mustFail)
	switch {
	case err != nil && !mustFail:
		// Refused before anything moved (no *TransferError): the owner
		// keeps its bytes, documented, and later reads check that.
		tg.pending = w.done(route, l, o.fresh, moved(err))
		return
	case err != nil:
		// A refused write must leave the owner's bytes alone.
		w.unchanged(o, tg.o, tg.idx, tg.shadow)
		tg.pending = w.done(route, l, o.fresh, moved(err))
		return
	}
	got := tg.o.sum(tg.idx, o.roff, o.size)
	switch {
	case mustFail:
		tg.pending = w.done(route, l, o.fresh, true)
	case got != testpeer.Sum(src):
		what := "other bytes"
		if got == testpeer.Sum(tg.shadow[o.roff:o.roff+o.size]) {
			what = "its previous bytes"
		}
		w.violate(o, "returned nil but the owner's range holds %s", what)
		tg.pending = w.done(route, l, o.fresh, true)
	default:
		copy(tg.shadow[o.roff:], src)
		w.done(route, l, o.fresh, false)
	}
}

// unchanged checks that a refused write left the owner's range as it was.
func (w *worker) unchanged(o *op, ow owner, idx int, pattern []byte) {
	if ow.sum(idx, o.roff, o.size) != testpeer.Sum(pattern[o.roff:o.roff+o.size]) {
		w.violate(o, "the write failed but the owner's range changed")
	}
}

func (w *worker) read(route string, oi int) {
	var src ownedBuf
	tg := w.rw[oi]
	switch w.rng.IntN(4) {
	case 0:
		src = w.r.big[oi]
	case 1:
		src = w.ro[oi].ownedBuf
	default:
		w.settle(tg)
		src = ownedBuf{o: tg.o, idx: tg.idx, h: tg.h, pattern: tg.shadow}
	}
	n := w.size(min(rwSize, src.h.Len()))
	roff := w.rng.Uint64N(src.h.Len() - n + 1)
	w.readFrom(route, "read", src.o, src.h, src.pattern, n, roff, false)
}

// readFrom reads [roff, roff+n) of h (whose bytes are pattern) and checks it.
func (w *worker) readFrom(route, kind string, ow owner, h transport.RemoteBuffer, pattern []byte, n, roff uint64, mustFail bool) {
	l, dst, loff, fresh := w.localFor(route, n)
	if !fresh {
		copy(dst.Bytes(), w.r.poison[loff:loff+n])
	}
	s, err := h.Slice(roff, n)
	w.must(err, "slice a handle")
	o := &op{kind: kind, route: route, owner: ow.name(), size: n, roff: roff, loff: loff, fresh: fresh}
	err = w.run(o, func(ctx context.Context) error { return w.r.mgrs[route].ReadInto(ctx, dst, s) })
	var want []byte
	if !mustFail {
		want = pattern[roff : roff+n]
	}
	w.done(route, l, fresh, w.checkRead(o, dst, want, err, mustFail))
}

func (w *worker) write(route string, oi int) {
	tg := w.rw[oi]
	w.settle(tg)
	n := w.size(rwSize)
	roff := w.rng.Uint64N(rwSize - n + 1)
	w.writeTo(route, "write", tg, tg.h, n, roff, false)
}

// writeTo writes n random bytes at roff of h (a handle of tg) and checks
// the owner's range.
func (w *worker) writeTo(route, kind string, tg *target, h transport.RemoteBuffer, n, roff uint64, mustFail bool) {
	l, src, loff, fresh := w.localFor(route, n)
	p := w.rng.Uint64N(uint64(len(w.r.pool)) - n + 1)
	copy(src.Bytes(), w.r.pool[p:p+n])
	s, err := h.Slice(roff, n)
	w.must(err, "slice a handle")
	o := &op{kind: kind, route: route, owner: tg.o.name(), size: n, roff: roff, loff: loff, fresh: fresh}
	err = w.run(o, func(ctx context.Context) error { return w.r.mgrs[route].WriteFrom(ctx, s, src) })
	w.checkWrite(o, route, l, tg, src.Bytes(), err, mustFail)
}

// badKey: a read or write with an altered key must fail, and a write
// must not change the owner's bytes.
func (w *worker) badKey(route string, oi int) {
	tg := w.rw[oi]
	w.settle(tg)
	n := w.size(rwSize)
	roff := w.rng.Uint64N(rwSize - n + 1)
	if w.rng.IntN(2) == 0 {
		w.readFrom(route, "bad-key read", tg.o, tg.badKey, nil, n, roff, true)
		return
	}
	w.writeTo(route, "bad-key write", tg, tg.badKey, n, roff, true)
}

// closeOne: the owner registers a buffer, the worker reads it once (it
// must work), then the owner closes it; later ops on it must fail.
func (w *worker) closeOne(route string, oi int) {
	ow := w.r.owners[oi]
	n := uint64(4096 + w.rng.IntN(1<<20))
	s := w.rng.Uint64()
	h, idx, err := ow.register(int(n), mr.ReadWrite, s)
	w.must(err, "register a buffer to close")
	pattern := testpeer.Pattern(int(n), s)
	l, dst, loff, fresh := w.localFor(route, min(n, rwSize))
	if !fresh {
		copy(dst.Bytes(), w.r.poison[loff:loff+dst.Len()])
	}
	first, _ := h.Slice(0, dst.Len())
	o := &op{kind: "read before close", route: route, owner: ow.name(), size: dst.Len(), loff: loff, fresh: fresh}
	err = w.runWith(context.Background(), o, deadline{desc: "none (" + integrityTimeout.String() + ")", none: true},
		func(ctx context.Context) error { return w.r.mgrs[route].ReadInto(ctx, dst, first) })
	w.done(route, l, fresh, w.checkRead(o, dst, pattern[:dst.Len()], err, false))
	ow.closeBuf(idx)
	c := append(w.closed[oi], ownedBuf{o: ow, idx: idx, h: h, pattern: pattern})
	if len(c) > closedKept {
		c = c[1:]
	}
	w.closed[oi] = c
}

// onClosed: a read or write of a buffer its owner closed must fail, and
// the write must not change its bytes.
func (w *worker) onClosed(route string, oi int) {
	if len(w.closed[oi]) == 0 || w.rng.IntN(4) == 0 {
		w.closeOne(route, oi)
	}
	c := w.closed[oi][w.rng.IntN(len(w.closed[oi]))]
	n := w.size(min(rwSize, c.h.Len()))
	roff := w.rng.Uint64N(c.h.Len() - n + 1)
	if w.rng.IntN(2) == 0 {
		w.readFrom(route, "closed read", c.o, c.h, nil, n, roff, true)
		return
	}
	// A stand-in target: the closed buffer's bytes never change.
	tg := &target{o: c.o, idx: c.idx, h: c.h, shadow: c.pattern}
	w.writeTo(route, "closed write", tg, c.h, n, roff, true)
}

// readOnlyWrite: a write to a read-only buffer, through its handle or
// one whose access bits were forged, must fail and change nothing.
func (w *worker) readOnlyWrite(route string, oi int) {
	ro := w.ro[oi]
	h, kind := ro.h, "read-only write"
	switch w.rng.IntN(3) {
	case 0:
		h, kind = ro.forged, "forged-access write"
	case 1:
		big := w.r.big[oi]
		n := w.size(rwSize)
		roff := w.rng.Uint64N(bigSize - n + 1)
		w.writeTo(route, "read-only write", &target{o: big.o, idx: big.idx, h: big.h, shadow: big.pattern}, big.h, n, roff, true)
		return
	}
	n := w.size(roSize)
	roff := w.rng.Uint64N(roSize - n + 1)
	w.writeTo(route, kind, &target{o: ro.o, idx: ro.idx, h: ro.h, shadow: ro.pattern}, h, n, roff, true)
}

// outOfRange: slices past the end, a destination smaller than the
// source, and a handle altered to reach past its buffer must all fail.
func (w *worker) outOfRange(route string, oi int) {
	ro := w.ro[oi]
	o := &op{route: route, owner: ro.o.name(), dl: deadline{desc: "none", none: true}}
	switch w.rng.IntN(4) {
	case 0:
		o.kind, o.roff = "remote slice past the end", w.rng.Uint64N(roSize+1)
		o.size = roSize - o.roff + 1 + w.rng.Uint64N(4096)
		_, err := ro.h.Slice(o.roff, o.size)
		w.outcome(o, err, true)
	case 1:
		l := w.locals[route]
		o.kind, o.loff = "local slice past the end", w.rng.Uint64N(rwSize+1)
		o.size = rwSize - o.loff + 1 + w.rng.Uint64N(4096)
		_, err := l.b.Slice(o.loff, o.size)
		w.outcome(o, err, true)
	case 2:
		o.kind, o.size = "read into a smaller buffer", roSize
		dst, _ := w.locals[route].b.Slice(0, roSize-1-w.rng.Uint64N(4096))
		err := w.run(o, func(ctx context.Context) error { return w.r.mgrs[route].ReadInto(ctx, dst, ro.h) })
		w.outcome(o, err, true)
	default:
		n := 1 + w.rng.Uint64N(roSize)
		roff := roSize - w.rng.Uint64N(min(n, roSize)) // reaches past the end
		w.readFrom(route, "read past the end", ro.o, ro.long, nil, n, roff, true)
	}
}

// bigRead reads 16–64 MiB of the big read-only buffer into a new local
// buffer; short, when the deadline is to end mid-transfer.
func (w *worker) bigRead(route string, oi int, short bool) {
	n := uint64(16<<20) + w.rng.Uint64N(bigSize-16<<20+1)
	roff := w.rng.Uint64N(bigSize - n + 1)
	big := w.r.big[oi]
	l := w.newLocal(route, int(n))
	s, _ := big.h.Slice(roff, n)
	o := &op{kind: "big read", route: route, owner: big.o.name(), size: n, roff: roff, fresh: true}
	f := func(ctx context.Context) error { return w.r.mgrs[route].ReadInto(ctx, l.b, s) }
	var err error
	if short {
		ctx, cancel, dl := w.within(logUniform(w.rng, 500*time.Microsecond, 4*time.Millisecond))
		err = w.runWith(ctx, o, dl, f)
		cancel()
	} else {
		err = w.run(o, f)
	}
	w.done(route, l, true, w.checkRead(o, l.b, w.r.bigShadow[roff:roff+n], err, false))
}

// burst is the sequence an independent user saw fail on tcp;ofi_rxm: a
// read with an altered key, a 64 MiB read whose deadline of a few ms
// passes, then a small read into a newly registered buffer.
func (w *worker) burst(oi int) {
	const route = "tcp;ofi_rxm"
	tg := w.rw[oi]
	w.settle(tg)
	roff := w.rng.Uint64N(rwSize - 4096 + 1)
	w.readFrom(route, "burst bad-key read", tg.o, tg.badKey, nil, 4096, roff, true)
	w.bigRead(route, oi, true)
	n := uint64(1 + w.rng.IntN(8192))
	roff = w.rng.Uint64N(rwSize - n + 1)
	l := w.newLocal(route, int(n))
	s, _ := tg.h.Slice(roff, n)
	o := &op{kind: "burst small read", route: route, owner: tg.o.name(), size: n, roff: roff, fresh: true}
	ctx, cancel, dl := w.within(5 * time.Second)
	err := w.runWith(ctx, o, dl, func(ctx context.Context) error { return w.r.mgrs[route].ReadInto(ctx, l.b, s) })
	cancel()
	w.done(route, l, true, w.checkRead(o, l.b, tg.shadow[roff:roff+n], err, false))
}

// action submits 2–4 reads and writes on one manager at once, each on
// its own segment of the targets and of the local buffer, and checks
// each of them.
func (w *worker) action(route string) {
	k := 2 + w.rng.IntN(3)
	seg := uint64(rwSize / k)
	l, base, loff, fresh := w.localFor(route, rwSize)
	if !fresh {
		copy(base.Bytes(), w.r.poison)
	}
	type part struct {
		write bool
		tg    *target
		src   ownedBuf
		dst   *transport.Buffer
		o     *op
	}
	parts := make([]part, k)
	a := w.r.mgrs[route].NewAction()
	for i := range parts {
		p := &parts[i]
		oi := w.pickOwner(route)
		p.write = w.rng.IntN(2) == 0
		n := w.size(seg)
		roff := uint64(i)*seg + w.rng.Uint64N(seg-n+1)
		lo := uint64(i)*seg + w.rng.Uint64N(seg-n+1)
		p.dst, _ = base.Slice(lo, n)
		kind := "action read"
		if p.write {
			kind = "action write"
		}
		p.o = &op{kind: kind, route: route, owner: w.r.owners[oi].name(), size: n, roff: roff, loff: loff + lo, fresh: fresh}
		switch {
		case p.write:
			p.tg = w.rw[oi]
			w.settle(p.tg)
			q := w.rng.Uint64N(uint64(len(w.r.pool)) - n + 1)
			copy(p.dst.Bytes(), w.r.pool[q:q+n])
			s, _ := p.tg.h.Slice(roff, n)
			a.WriteFrom(s, p.dst)
		case w.rng.IntN(3) == 0:
			p.src = w.r.big[oi]
			s, _ := p.src.h.Slice(roff, n)
			a.ReadInto(p.dst, s)
		default:
			tg := w.rw[oi]
			w.settle(tg)
			p.src = ownedBuf{o: tg.o, idx: tg.idx, h: tg.h, pattern: tg.shadow}
			s, _ := p.src.h.Slice(roff, n)
			a.ReadInto(p.dst, s)
		}
	}
	o := &op{kind: "action", route: route, owner: fmt.Sprintf("%d ops", k), loff: loff, fresh: fresh}
	for i := range parts {
		o.size += parts[i].o.size
	}
	err := w.run(o, a.Submit)
	w.outcome(o, err, false)
	tainted := err != nil && moved(err)
	var writes []*target
	for i := range parts {
		p := &parts[i]
		p.o.dl, p.o.start, p.o.took, p.o.ctxErr = o.dl, o.start, o.took, o.ctxErr
		switch {
		case p.write && err != nil:
			writes = append(writes, p.tg)
		case err != nil:
		case p.write:
			got := p.tg.o.sum(p.tg.idx, p.o.roff, p.o.size)
			if got != testpeer.Sum(p.dst.Bytes()) {
				w.violate(p.o, "the action returned nil but the owner's range holds other bytes")
				tainted = true
				writes = append(writes, p.tg)
				continue
			}
			copy(p.tg.shadow[p.o.roff:], p.dst.Bytes())
		default:
			want := p.src.pattern[p.o.roff : p.o.roff+p.o.size]
			if got := p.dst.Bytes(); !bytes.Equal(got, want) {
				w.violate(p.o, "the action returned nil but the destination is wrong: %s",
					diff(got, want, w.r.poison[p.o.loff:], fresh))
				tainted = true
			}
		}
	}
	s := w.done(route, l, fresh, tainted)
	if tainted {
		for _, tg := range writes {
			tg.pending = s
		}
	}
}

// report logs the counts and fails the test on violations.
func (r *integrityRun) report(ran time.Duration) {
	t := r.t
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	var b strings.Builder
	for _, route := range r.routes {
		kinds := r.stats[route]
		keys := make([]string, 0, len(kinds))
		n := 0
		for k, c := range kinds {
			keys = append(keys, k)
			n += c
		}
		sort.Strings(keys)
		total += n
		fmt.Fprintf(&b, "\n  %s: %d ops, %d nil after a context that had already ended:", route, n, r.nilEnded[route])
		for _, k := range keys {
			fmt.Fprintf(&b, "\n    %-36s %d", k, kinds[k])
		}
	}
	t.Logf("integrity: %d ops in %v by %d workers, %d violations; seed %d%s",
		total, ran.Round(time.Millisecond), integrityWorkers, len(r.violations), r.seed, b.String())
	for i, v := range r.violations {
		if i == shownViolations {
			t.Errorf("... and %d more violations", len(r.violations)-shownViolations)
			break
		}
		t.Error(v)
	}
	if len(r.violations) > 0 {
		t.Errorf("%d violations of \"nil means the bytes are there\" or of the error classes; replay with TEST_SEED=%d",
			len(r.violations), r.seed)
	}
}
