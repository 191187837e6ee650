package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
)

// Buffer is registered local memory, or a slice of it. Peers reach it
// through its Remote handle; the manager's transfers read into it and
// write from it. Slices share the registration: closing any closes all.
type Buffer struct {
	st  *bufState
	off uint64
	n   uint64
}

// bufState is one registration, shared by a buffer and its slices.
type bufState struct {
	m      *Manager
	id     uint64
	mem    []byte  // host memory; nil for device memory
	base   uintptr // address of the registration (off the Go heap, or device memory)
	size   uint64
	iface  mr.Iface // mr.Host, or device memory
	device int
	// devicePCI is device memory's PCI address, or ""; near, once
	// worked out (nearRails), the rails nearest the memory.
	devicePCI string
	nearOnce  sync.Once
	near      []int
	access    mr.Access
	mrsMu     sync.Mutex   // guards mrs, which grows when a backend is added (replaceSameNode), and spare
	mrs       []*fabric.MR // per backend index
	spare     []spareMR    // registrations that lost a race to mrs (desc), closed with it (closeMR)
	mrClosed  []bool       // per backend index: closeMR ran, and no registration may be kept there any more
	eps       []remoteEP   // the handle's endpoints
	guard     uint32       // shm guard slot
	hasGrd    bool
	shared    bool // peers may map it (the mem route): a whole mr.Alloc allocation they may read
	owned     bool // Manager.Alloc's: the memory goes with the registration
	// freed: freeOwned freed the memory (Bytes is nil from then on).
	freed atomic.Bool
	// left counts the jobs left with ops in flight (AddLeft); leftAt:
	// when the last was left (UnixNano); unguarded: the rails' probe
	// buffer, whose probes left in flight are of no one's concern.
	left      atomic.Int32
	leftAt    atomic.Int64
	unguarded bool
	// unhold ends the mr.Hold that keeps mr.Free off host memory while
	// it is registered (nil once ended, and for device memory). Under mu.
	unhold func()
	// kept: a peer still copied with the memory when Close stopped
	// waiting; it is never freed. Under mu.
	kept bool
	// released: freeOwned found the registrations closed and no transfer
	// holding the memory; releasedCh is Released's, made on demand and
	// closed then. Under mu.
	released   bool
	releasedCh chan struct{}
	// mayFree: the registrations are closed (freeOwned's callers close
	// them first), so the last transfer's Unref may free owned memory.
	// Until then a freed page could still take a peer's write through
	// its key. Under mu.
	mayFree bool

	mu           sync.Mutex
	refs         int  // transfers using the memory
	closed       bool // no new transfers
	deregistered bool
	// leftErr: deregister's error when a registration stayed on a stuck
	// endpoint; a later Close returns it too.
	leftErr error
	stuck   int           // refs of transfers whose ops may never complete
	drained chan struct{} // a Close waiting for refs to reach stuck
}

// Alloc allocates n bytes (mr.Alloc) and registers them with the remote
// access given, in one step: the Buffer owns its memory, and its Close
// deregisters and frees it. When Close returns an error, the memory stays
// until whatever still uses it is done (or, for a peer that still copied
// with it on the mem route, for good); after Close the Buffer's Bytes must
// not be used.
func (m *Manager) Alloc(n int, access mr.Access) (*Buffer, error) {
	mem, err := mr.Alloc(n)
	if err != nil {
		return nil, err
	}
	b, err := m.Register(mem, access)
	if err != nil {
		if !errors.Is(err, ErrEndpointWedged) { // else a registration may stay: the memory too
			_ = mr.Free(mem)
		}
		return nil, err
	}
	b.st.mu.Lock()
	b.st.owned = true
	b.st.mu.Unlock()
	return b, nil
}

// Register registers mem for RMA on every backend of the manager, with
// the remote access given. mem must come from mr.Alloc (or mr.Adopt):
// Go heap memory is refused with an error saying so. It stays the
// caller's: mr.Free refuses its allocation until Close (or Manager.Close)
// returned nil, since a peer could otherwise write into whatever the
// next mr.Alloc puts at that address. With libfabric's shm, a Register
// after a same-node peer died first checks the shm endpoint that death
// may have blocked, and takes up to the poll policy's WedgeAfter (10 s by
// default) when it did (docs/RELIABILITY.md).
func (m *Manager) Register(mem []byte, access mr.Access) (*Buffer, error) {
	if err := mr.CheckOffHeap(mem); err != nil {
		return nil, err
	}
	release := mr.Hold(mem)
	st := &bufState{mem: mem, base: mr.Addr(mem), size: uint64(len(mem)), iface: mr.Host}
	b, err := m.register(st, access)
	if err != nil {
		if !errors.Is(err, ErrEndpointWedged) { // else a registration may stay, and the hold with it
			release()
		}
		return nil, err
	}
	st.mu.Lock()
	if st.mayFree && !st.kept && st.refs == 0 {
		// A Manager.Close closed it before this: freeOwned ran already.
		st.mu.Unlock()
		release()
		return b, nil
	}
	st.unhold = release
	st.mu.Unlock()
	return b, nil
}

// RegisterDevice registers device (GPU) memory on every backend, through
// the same Buffer type: it needs a manager opened WithDeviceMemory, whose
// backends were chosen among providers with FI_HMEM. The Buffer's Bytes is
// nil (fitransfer never touches device memory from the CPU); same-manager
// copies and the cma path do not apply to it. A completion of a transfer
// into device memory does not by itself make the bytes visible to kernels
// running on the device (see docs/EFA.md).
func (m *Manager) RegisterDevice(d mr.Device, access mr.Access) (*Buffer, error) {
	if err := d.Check(); err != nil {
		return nil, err
	}
	if !m.cfg.hmem {
		return nil, fmt.Errorf("%w: open the manager WithDeviceMemory to register %v memory", ErrDeviceMemory, d.Iface)
	}
	return m.register(&bufState{base: d.Ptr, size: d.Len, iface: d.Iface, device: d.Device, devicePCI: d.PCIBusID}, access)
}

func (m *Manager) register(st *bufState, access mr.Access) (*Buffer, error) {
	if access&^mr.ReadWrite != 0 {
		return nil, fmt.Errorf("register: unknown access bits %#x", uint8(access))
	}
	m.afterPeerDeaths(nil)
	b, stuck, err := m.registerOnce(st, access)
	if stuck != nil && m.replaceIfStuck(stuck, err) {
		*st = bufState{mem: st.mem, base: st.base, size: st.size, iface: st.iface, device: st.device, devicePCI: st.devicePCI}
		b, _, err = m.registerOnce(st, access) // on the shm endpoint that took the stuck one's place
	}
	return b, err
}

// registerOnce registers st on every backend; when one fails, it also
// returns that backend.
func (m *Manager) registerOnce(st *bufState, access mr.Access) (*Buffer, *libfabric.Route, error) {
	if err := m.acquire(); err != nil {
		return nil, nil, err
	}
	defer m.releaseManager()
	m.replaceMu.RLock()
	defer m.replaceMu.RUnlock()
	bs := m.backends()
	st.m, st.id, st.access, st.mrs = m, m.nextID.Add(1), access, make([]*fabric.MR, bs.indexes)
	base := st.base
	for _, b := range bs.all {
		if b.Retired.Load() || b.Outgoing {
			continue // an Outgoing endpoint registers the buffer when an op needs it there (desc)
		}
		var err error
		st.mrs[b.Index], err = b.Register(mr.Region{Addr: st.base, Len: st.size, Access: access, Iface: st.iface, Device: st.device})
		if err != nil {
			return nil, b, errors.Join(err, st.deregister())
		}
		st.eps = append(st.eps, remoteEP{provider: b.Name(), rail: uint8(b.Rail), name: b.EndpointName(), key: st.mrs[b.Index].Key(),
			base: mr.RemoteAddr(b.VirtAddr, base, 0)})
	}
	if g := m.guard; g != nil {
		var shmKey uint64
		if s := bs.sameNode; s != nil {
			shmKey = st.mrs[s.Index].Key()
		}
		cmaKey := mr.RandomKey(8)
		slot, gen, err := g.publish(st.id, uint64(base), st.size, shmKey, cmaKey, access)
		if err != nil {
			return nil, nil, errors.Join(err, st.deregister())
		}
		st.guard, st.hasGrd = slot, true
		for i := range st.eps {
			if s := bs.sameNode; s != nil && st.eps[i].provider == s.Name() {
				st.eps[i].guard = &guardRef{table: mr.RemoteAddr(s.VirtAddr, uintptr(g.base), 0), key: s.Scratch.TableKey(), slot: slot, gen: gen}
			}
		}
		if m.cma != nil && st.iface == mr.Host { // process_vm_* cannot reach device memory
			st.eps = append([]remoteEP{{provider: cma.Name, name: cma.ProcName(os.Getpid()), key: cmaKey, base: uint64(base),
				guard: &guardRef{table: g.base, key: g.id, slot: slot, gen: gen}}}, st.eps...)
		}
		if m.memOn && st.iface == mr.Host && access.Allows(mr.RemoteRead) && mr.Whole(st.mem) {
			// A peer that maps the file can read all of it: shared only
			// when peers may read it anyway (a write-only buffer keeps
			// the routes that write without reading).
			st.shared = true
			st.eps = append([]remoteEP{{provider: mem.Name, name: cma.ProcName(os.Getpid()), key: cmaKey, base: uint64(base),
				guard: &guardRef{table: g.base, key: g.id, slot: slot, gen: gen}}}, st.eps...)
		}
	}
	if len(st.eps) == 0 && access != 0 { // a buffer without remote access needs no route
		st.revokeGuard(time.Now())
		derr := st.deregister()
		why := "none of its routes can share it"
		if m.memOn && st.iface == mr.Host && !access.Allows(mr.RemoteRead) {
			why = "the mem route shares only memory peers may read (a mapping reads what it writes)"
		}
		return nil, nil, errors.Join(fmt.Errorf("%w: this manager has no route peers could reach the buffer by: %s; open it with cma or shm as well",
			ErrNoRoute, why), derr)
	}
	m.bufsMu.Lock()
	m.bufs[st.id] = st
	m.bufsMu.Unlock()
	return &Buffer{st: st, n: st.size}, nil, nil
}

// Bytes is the buffer's memory; nil for device memory. A Manager.Alloc
// buffer's memory is freed by its Close and by Manager.Close: Bytes is nil
// once it is, and a slice it gave before must not be used after either.
func (b *Buffer) Bytes() []byte {
	if b.st.mem == nil || b.st.freed.Load() {
		return nil
	}
	return b.st.mem[b.off : b.off+b.n]
}

// Device reports the kind of memory (mr.Host, or device memory).
func (b *Buffer) Device() mr.Iface { return b.st.iface }

// Len is the buffer's length in bytes.
func (b *Buffer) Len() uint64 { return b.n }

// Access is what peers may do with the buffer.
func (b *Buffer) Access() mr.Access { return b.st.access }

// Slice returns bytes [off, off+n) of b, sharing its registration. Its
// handle (Remote) is a view, not a boundary: its key is the
// registration's, so a peer holding it can reach every byte of the
// buffer, with the buffer's access, by editing the range it names. To
// let a peer reach part of the memory only, register that part.
func (b *Buffer) Slice(off, n uint64) (*Buffer, error) {
	if off > b.n || n > b.n-off {
		return nil, fmt.Errorf("%w: a slice of %d bytes at offset %d of a %d-byte buffer", ErrOutOfRange, n, off, b.n)
	}
	return &Buffer{st: b.st, off: b.off + off, n: n}, nil
}

// Remote is the handle peers use to reach this buffer (or slice: see
// Slice for what a slice's handle reaches).
func (b *Buffer) Remote() RemoteBuffer {
	st := b.st
	return RemoteBuffer{node: st.m.node, owner: st.m.id, id: st.id, off: b.off, n: b.n,
		size: st.size, access: st.access, eps: st.eps}
}

// Close deregisters the buffer: peers' later transfers with its handles
// fail, and the manager's transfers with it are refused. When it returns
// nil, libfabric is done with the memory and the caller may free it.
//
// A transfer that ended by its deadline or context can leave ops with the
// provider; they still read or write the memory until they complete.
// Close waits for them, up to the manager's timeout (WithTimeout). If they
// are still in flight then, it returns an *InUseError: the registration
// stays until they end or the manager closes, and the memory must not be
// freed before Released is closed. When a registration stays on an
// endpoint stuck inside libfabric (ErrEndpointWedged), the memory must
// not be freed at all; a later Close says so again. Closing a
// registration waits for its endpoint: over libfabric's shm after a
// same-node peer died, up to the poll policy's WedgeAfter (10 s by
// default; docs/RELIABILITY.md), which may be longer than the timeout.
// Otherwise closing twice, or after the manager closed, is a no-op.
func (b *Buffer) Close() error {
	st := b.st
	st.mu.Lock()
	if st.closed {
		err := st.leftErr
		st.mu.Unlock()
		return err
	}
	st.closed = true
	idle := st.refs == 0
	var drained chan struct{}
	if !idle && st.refs > st.stuck {
		drained = make(chan struct{})
		st.drained = drained
	}
	st.mu.Unlock()
	st.m.bufsMu.Lock()
	delete(st.m.bufs, st.id)
	st.m.closingBufs[st.id] = st
	st.m.bufsMu.Unlock()
	// One wait for both: the peers' copies, then this process's transfers.
	wait := st.m.cfg.timeout
	deadline := time.Now().Add(wait)
	if peers := st.revokeGuard(deadline); peers != nil {
		// A peer still copies with the memory: it must stay as it is.
		st.mu.Lock()
		st.kept = true
		st.mu.Unlock()
		return &InUseError{Buffer: st.id, Peers: peers, Waited: wait}
	}
	if idle {
		return st.deregister()
	}
	if drained != nil {
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-drained:
		case <-t.C:
		}
		t.Stop()
	}
	st.mu.Lock()
	refs, stuck := st.refs, st.stuck
	st.drained = nil // from now on the last unref deregisters
	st.mu.Unlock()
	if refs == 0 {
		return st.deregister()
	}
	e := &InUseError{Buffer: st.id, Transfers: refs, Stuck: stuck}
	if refs > stuck {
		e.Waited = wait
	}
	return e
}

// Released is closed once the buffer is closed (by its Close or the
// manager's) and nothing uses its memory any more: its registrations are
// closed and no transfer holds it. A Manager.Alloc buffer's memory is
// freed then, and memory the caller registered may be freed or reused.
// After a Close that returned an *InUseError it closes when the
// transfers left with the provider end; it never closes for memory kept
// for good: a peer still copied with it (InUseError.Peers), or a
// registration stayed on an endpoint stuck inside libfabric.
func (b *Buffer) Released() <-chan struct{} {
	st := b.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.releasedCh == nil {
		st.releasedCh = make(chan struct{})
		if st.released {
			close(st.releasedCh)
		}
	}
	return st.releasedCh
}

// AddStuck counts transfers holding the buffer whose ops may never
// complete; a Close waiting only for such transfers stops waiting. It
// and Unref make a bufState the libfabric.Holder of its transfers.
func (st *bufState) AddStuck(delta int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.stuck += delta
	st.wakeCloser()
}

// AddLeft counts the jobs that a request's waiter left with ops in flight
// (a deadline or cancel came first), until they are idle: their ops may
// still write the memory (reads into it), after the request returned.
func (st *bufState) AddLeft(delta int) {
	if st.unguarded {
		return
	}
	if delta > 0 {
		st.leftAt.Store(time.Now().UnixNano())
	}
	st.left.Add(int32(delta))
}

// awaitLeft waits, within t's limits, until no op that an earlier request
// left in flight on st is in flight any more: one still writing the
// memory could land after a later request into the same memory returned
// nil (a new user's review: late bytes of a timed-out read overwrote a
// later read's). Past t's limits it returns their error. Ops left longer
// than leftPatience ago are taken for stuck, and not waited for.
func (st *bufState) awaitLeft(t *reqTimes) error {
	for pause := 20 * time.Microsecond; st.left.Load() > 0; pause = min(2*pause, time.Millisecond) {
		if time.Since(time.Unix(0, st.leftAt.Load())) >= leftPatience {
			return nil
		}
		if err := t.err(); err != nil {
			return err
		}
		time.Sleep(pause)
	}
	return nil
}

// leftPatience is how long after the last op left in flight on a buffer
// a request still waits for such ops: one toward a peer that died after
// the deadline, or in a call that never returns, may never end (a
// review), and waited for, it would keep the buffer from every request
// for good. As progress.WedgeAfter's default: such an op's late bytes
// would come from a peer that answered after that long.
const leftPatience = 10 * time.Second

// wakeCloser lets a waiting Close go on once only stuck transfers, or
// none, hold the buffer. Under st.mu.
func (st *bufState) wakeCloser() {
	if st.drained != nil && st.refs <= st.stuck {
		close(st.drained)
		st.drained = nil
	}
}

// ref holds the registration for a transfer; it fails once closed.
func (st *bufState) ref() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return fmt.Errorf("%w: buffer %d", ErrBufferClosed, st.id)
	}
	st.refs++
	return nil
}

// hold takes one more reference for a transfer that already holds one
// (the next part of a long op). Unlike ref it does not fail once the
// buffer is closed: Close waits for the transfer either way.
func (st *bufState) hold() {
	st.mu.Lock()
	st.refs++
	st.mu.Unlock()
}

// Unref ends a transfer's hold; the last one after Close deregisters.
// It may run on a loop goroutine, so deregistration goes elsewhere.
func (st *bufState) Unref() {
	st.mu.Lock()
	st.refs--
	last := st.refs == 0 && st.closed && !st.deregistered
	if st.drained != nil {
		st.wakeCloser()
		last = false // the waiting Close deregisters
	}
	owned := (st.owned || st.unhold != nil) && st.mayFree && st.refs == 0
	st.mu.Unlock()
	switch {
	case last:
		go func() { _ = st.deregister() }() // its error is logged
	case owned:
		go st.freeOwned() // its registrations were closed while this transfer copied
	}
}

// revokeGuard invalidates the buffer's guard entry, then waits, until
// deadline, for the ops that peers marked in their use pages (mem, cma,
// shm: no same-node route is taken without one) began before: it returns
// the processes still in one then (their slot stays taken).
func (st *bufState) revokeGuard(deadline time.Time) []int {
	if !st.hasGrd {
		return nil
	}
	st.m.guard.revoke(st.guard)
	busy := st.m.memPeers.wait(st.guard, deadline)
	if busy == nil {
		st.m.guard.release(st.guard)
	}
	return busy
}

// deregister closes the MRs, each on its backend's loop, then frees the
// memory of a Manager.Alloc buffer. An endpoint that is closing (by
// Manager.Close, or a rail's replacement) closes the buffer's MR itself
// (closingBufs): deregister waits for that before it frees. It returns an
// error wrapping ErrEndpointWedged when an MR stays open on an endpoint
// stuck inside libfabric; the memory then stays too.
func (st *bufState) deregister() error {
	st.mu.Lock()
	if st.deregistered {
		st.mu.Unlock()
		return nil
	}
	st.deregistered = true
	st.mu.Unlock()
	var left []error
	for _, b := range st.m.backends().all {
		// st.mrs[i] is read and cleared only on backend i's loop: a
		// Manager.Close closing the same MR runs there too. A retired
		// backend's loop may be stuck in a call: no plain Do there, which
		// would wait for the wedge.
		if !b.Retired.Load() && b.Do(func() { st.closeMR(b.Index) }) == nil {
			continue
		}
		if !st.registeredOn(b.Index) {
			continue
		}
		var err error
		switch wedged := b.Wedged(); {
		case b.Closing():
			err = b.AwaitStop()
		case b.Retired.Load() && wedged != nil:
			// Retired for good inside a call that does not return (shm
			// spinning on a dead peer's region lock): nothing of
			// that endpoint runs again, and its MR goes with the process.
			continue
		case b.Retired.Load():
			// Retired, and its calls return (2.x's stalled command queue,
			// or a replacement for another cause): close the MR there.
			if b.DoBy(context.Background(), time.Now().Add(retiredWait), func() { st.closeMR(b.Index) }) == nil {
				continue
			}
			err = fmt.Errorf("%w: the %s endpoint was retired, and a call of its had not returned after %v", ErrEndpointWedged, b.Provider, retiredWait)
		case wedged != nil:
			err = wedged
		default:
			err = fmt.Errorf("%w: the %s endpoint refused the deregistration", ErrEndpointWedged, b.Provider)
		}
		if err != nil {
			left = append(left, err)
			continue
		}
		// The loop exited: none of its calls can be under way. Its close
		// closed the MR, unless the buffer left bufs before that list was
		// taken and closingBufs after — which Close's order rules out.
		st.closeMR(b.Index)
	}
	if len(left) > 0 {
		// Still in closingBufs: should the stuck call return, the
		// endpoint's close closes the MR.
		st.m.log.Error().Uint64("buffer", st.id).Errs("endpoints", left).
			Msg("buffer's registration left on an endpoint stuck inside libfabric; its memory stays")
		err := fmt.Errorf("buffer %d: its registration stays on an endpoint stuck inside libfabric, so do not free or reuse the memory (a Manager.Alloc buffer's is kept): %w",
			st.id, errors.Join(left...))
		st.mu.Lock()
		st.leftErr = err
		st.mu.Unlock()
		return err
	}
	st.leaveClosing()
	st.freeOwned()
	return nil
}

// retiredWait bounds deregister's wait for a retired endpoint whose calls
// return: it is idle or between short calls.
const retiredWait = time.Second

// leaveClosing takes the buffer off the manager's closingBufs once its
// registrations are closed.
func (st *bufState) leaveClosing() {
	st.m.bufsMu.Lock()
	if st.m.closingBufs[st.id] == st {
		delete(st.m.closingBufs, st.id)
	}
	st.m.bufsMu.Unlock()
}

// registeredOn reports whether an MR of the buffer is open on backend
// index i.
func (st *bufState) registeredOn(i int) bool {
	st.mrsMu.Lock()
	defer st.mrsMu.Unlock()
	if i < len(st.mrs) && st.mrs[i] != nil {
		return true
	}
	for _, sp := range st.spare {
		if sp.backend == i {
			return true
		}
	}
	return false
}

// freeOwned ends the buffer's hold on its memory (mr.Hold) and frees the
// memory of a Manager.Alloc buffer, once, unless a peer may still copy
// with it; while a transfer of this process holds it, the last one's
// Unref does. Its callers have closed the buffer's registrations: a
// Manager.Close that leaves them to a wedged endpoint does not call it,
// and the memory stays, held.
func (st *bufState) freeOwned() {
	st.mu.Lock()
	st.mayFree = true
	done := !st.kept && st.refs == 0
	free := done && st.owned
	if free {
		st.owned = false
	}
	var unhold func()
	if done {
		unhold, st.unhold = st.unhold, nil
	}
	st.mu.Unlock()
	if unhold != nil {
		unhold()
	}
	if free {
		st.freed.Store(true)
		_ = mr.Free(st.mem)
	}
	if done {
		st.mu.Lock()
		if !st.released { // once: the last Unref and deregister may both get here
			st.released = true
			if st.releasedCh != nil {
				close(st.releasedCh)
			}
		}
		st.mu.Unlock()
	}
}

// closeMR closes the MR of one backend; only on that backend's loop.
func (st *bufState) closeMR(i int) {
	st.mrsMu.Lock()
	for len(st.mrClosed) <= i {
		st.mrClosed = append(st.mrClosed, false)
	}
	st.mrClosed[i] = true
	var m *fabric.MR
	if i < len(st.mrs) {
		m, st.mrs[i] = st.mrs[i], nil
	}
	var spares []*fabric.MR
	kept := st.spare[:0]
	for _, sp := range st.spare {
		if sp.backend == i {
			spares = append(spares, sp.mr)
		} else {
			kept = append(kept, sp)
		}
	}
	clear(st.spare[len(kept):])
	st.spare = kept
	st.mrsMu.Unlock()
	if m != nil {
		_ = m.Close()
	}
	for _, sp := range spares {
		_ = sp.Close()
	}
}

// mrClosedAt reports whether closeMR ran for backend index i. Under
// mrsMu.
func (st *bufState) mrClosedAt(i int) bool { return i < len(st.mrClosed) && st.mrClosed[i] }

// spareMR is a registration of a buffer on backend index backend that
// another op's registration made redundant, left for closeMR when its
// request could not close it in time.
type spareMR struct {
	backend int
	mr      *fabric.MR
}

// desc is the local descriptor of the buffer on backend b. A buffer
// registered before b was opened (the shm endpoint that took a stuck
// one's place) is registered on b now, once: its local ops need it there.
// Peers keep reaching it by the routes its handle names.
func (st *bufState) desc(ctx context.Context, deadline time.Time, b *libfabric.Route) (fabric.Desc, error) {
	st.mrsMu.Lock()
	if b.Index < len(st.mrs) && st.mrs[b.Index] != nil {
		d := st.mrs[b.Index].Desc()
		st.mrsMu.Unlock()
		return d, nil
	}
	st.mrsMu.Unlock()
	m, err := b.RegisterBy(ctx, deadline, mr.Region{Addr: st.base, Len: st.size, Access: st.access, Iface: st.iface, Device: st.device})
	if err != nil {
		return nil, err
	}
	return st.adopt(ctx, deadline, b, m)
}

// adopt makes m the buffer's registration on b, unless another op's
// registration got there first: m is closed then, or, when the request
// ends while a call holds the endpoint, left for closeMR. It returns the
// descriptor to use, or ErrClosed when closeMR ran for b meanwhile (its
// rail was replaced): m is closed then, or left to a loop that is stuck.
func (st *bufState) adopt(ctx context.Context, deadline time.Time, b *libfabric.Route, m *fabric.MR) (fabric.Desc, error) {
	st.mrsMu.Lock()
	for len(st.mrs) <= b.Index {
		st.mrs = append(st.mrs, nil)
	}
	// The request holds the buffer and the manager, so the buffer's and
	// the manager's Close wait for it; a rail's replacement does not:
	// once closeMR ran for b, nothing kept here would ever be closed.
	kept, closed := st.mrs[b.Index], st.mrClosedAt(b.Index)
	if kept == nil && !closed {
		st.mrs[b.Index] = m
		st.mrsMu.Unlock()
		return m.Desc(), nil
	}
	st.mrsMu.Unlock()
	errClosed := fmt.Errorf("%w: the %s endpoint closed while the buffer was registered on it", ErrClosed, b.Provider)
	if b.DoBy(ctx, deadline, func() { _ = m.Close() }) == nil {
		if closed {
			return nil, errClosed
		}
		return kept.Desc(), nil
	}
	// The request ended while a call held the endpoint: the buffer's own
	// deregistration closes m, on the loop, unless it ran meanwhile.
	st.mrsMu.Lock()
	if !st.mrClosedAt(b.Index) {
		st.spare = append(st.spare, spareMR{backend: b.Index, mr: m})
		st.mrsMu.Unlock()
		return kept.Desc(), nil
	}
	st.mrsMu.Unlock()
	if b.Stopped() {
		_ = m.Close() // the loop exited: no call of its can be under way
	}
	return nil, errClosed
}

func (st *bufState) markClosed() {
	st.mu.Lock()
	st.closed, st.deregistered = true, true
	st.mu.Unlock()
}
