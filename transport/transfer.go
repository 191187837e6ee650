package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/internal/route/memcpy"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// ReadInto reads the remote buffer src into dst (the first src.Len()
// bytes), which must be at least as large. It returns when the bytes are
// in dst, or with an error: a *TransferError keeping every chunk's error
// for failures of the transfer itself (and for a context already done,
// before anything moved), or an error wrapping ErrTooSmall,
// ErrBufferClosed, ErrAccessDenied, ErrNoRoute, ErrStaleHandle... for bad
// input, before anything moved. The package documentation lists the
// classes errors.Is answers, route by route. A deadline or cancel cannot
// recall ops already with the provider: after an error they may still
// write dst for a while; a later request with dst waits for them (within
// its own limits), and Buffer.Close waits for them too.
func (m *Manager) ReadInto(ctx context.Context, dst *Buffer, src RemoteBuffer) error {
	if ctx == nil {
		return nilContext("ReadInto")
	}
	if dst == nil {
		return errors.New("ReadInto: nil destination buffer")
	}
	if dst.Len() < src.Len() {
		return fmt.Errorf("%w: reading %d bytes into a %d-byte buffer", ErrTooSmall, src.Len(), dst.Len())
	}
	local := view{dst.st, dst.off, src.Len()}
	if done, err := m.memFast(ctx, "read", progress.Read, local, &src); done {
		return err
	}
	ops := [1]opSpec{{op: progress.Read, local: local, remote: src}}
	return m.run(ctx, "read", ops[:])
}

// WriteFrom writes src into the remote buffer dst (its first src.Len()
// bytes), which must be at least as large. A nil error means the bytes
// are visible in the target's memory (FI_DELIVERY_COMPLETE) unless the
// manager uses WithTransmitComplete (Action.InjectComplete relaxes it
// further for an action's writes). Errors as for ReadInto.
func (m *Manager) WriteFrom(ctx context.Context, dst RemoteBuffer, src *Buffer) error {
	if ctx == nil {
		return nilContext("WriteFrom")
	}
	if src == nil {
		return errors.New("WriteFrom: nil source buffer")
	}
	if src.Len() > dst.Len() {
		return fmt.Errorf("%w: writing %d bytes into a %d-byte remote buffer", ErrTooSmall, src.Len(), dst.Len())
	}
	dst.n = src.n // the first src.Len() bytes: the op's length is its remote view's
	local := view{src.st, src.off, src.n}
	if done, err := m.memFast(ctx, "write", progress.Write, local, &dst); done {
		return err
	}
	ops := [1]opSpec{{op: progress.Write, local: local, remote: dst}}
	return m.run(ctx, "write", ops[:])
}

// holdErr is prepare's error for op o toward peer whose holdShm failed
// with err: a *progress.TimeoutError (Busy) as it is, with the op's
// fields, which execute reports as a request that moved nothing.
func holdErr(o *opSpec, err error, peer string) error {
	var te *progress.TimeoutError
	if errors.As(err, &te) && te.Busy {
		te.Op, te.Bytes, te.Peer = o.op, o.remote.n, peer
		return te
	}
	return fmt.Errorf("%s: %w", o.op, err)
}

// nilContext is the error of a call given a nil context.
func nilContext(call string) error {
	return fmt.Errorf("%s: nil context.Context: pass context.Background(), or a context with a deadline or a cancel", call)
}

// view is a range of a registration.
type view struct {
	st     *bufState
	off, n uint64
}

func (v view) ptr(off uint64) uintptr { return v.st.base + uintptr(v.off+off) }

// opSpec is one transfer of a request: local view, remote handle
// (its length is the transfer's), direction.
type opSpec struct {
	op     progress.Op
	local  view
	remote RemoteBuffer
	// sourceFree: a write that may complete once its local bytes may be
	// reused (Action.InjectComplete).
	sourceFree bool

	// set while executing
	kind      route.Kind
	b         *libfabric.Route // the fabric route; nil on the others
	ep        *remoteEP
	peer      *sameNodePeer // same-node routes: the owner the kernel verified
	target    *bufState     // memcpy: the other buffer
	x         *libfabric.Xfer
	link      *memLink // mem: the route to the owner
	mm        *memMap  // mem: the buffer's mapping, held for this op
	copied    bool     // mem: copied; memErr is the copy's error
	redos     uint8    // mem: routed again after its link ended (memRedos)
	memErr    error
	submitted bool
	sent      uint64           // bytes handed to jobs so far (see shmPart)
	pin       int              // 1 + the rail a piece must take (run); 0: any
	held      *libfabric.Route // the Outgoing shm endpoint held for the op (holdShm)
	fail      error            // its first error, once executed
	// deadline: its request's, once its job was filled (fabric ops): a
	// redo over the rails (run) keeps it.
	deadline time.Time
}

// failed records o's first error.
func (o *opSpec) failed(err error) {
	if o.fail == nil {
		o.fail = err
	}
}

func need(op progress.Op) mr.Access {
	if op == progress.Write {
		return mr.RemoteWrite
	}
	return mr.RemoteRead
}

// execute checks, routes and runs the ops of one request, waits for all of
// them and gathers their errors.
func (m *Manager) execute(ctx context.Context, kind string, ops []opSpec) error {
	if err := ctx.Err(); err != nil {
		return notStarted(kind, ops, err) // on every route, before anything is looked up or moved
	}
	times := reqTimes{ctx: ctx, timeout: m.cfg.timeout, quit: m.quit}
	if err := m.acquire(); err != nil {
		return err
	}
	m.requests.Add(1)
	defer m.requests.Add(-1) // after releaseOps, wherever the request ends
	if err := m.prepare(ctx, &times, ops); err != nil {
		m.releaseManager()
		m.replaceStuckShm(err)
		releaseOps(ops)
		if to, ok := err.(*progress.TimeoutError); ok && (to.Awaiting != "" || to.Busy) {
			return notStartedBy(kind, ops, to)
		}
		return err
	}
	var (
		total  uint64
		chunks int
		errs   []error
		failed int
	)
	for i := range ops {
		o := &ops[i]
		total += o.remote.n
		if o.kind != route.Fabric {
			continue
		}
		if err := o.b.Wedged(); err != nil {
			o.failed(err)
			errs = append(errs, err)
			failed++
			continue
		}
		if err := o.b.BlockedOrGone(o.op, o.ep.name); err != nil {
			o.failed(err)
			errs = append(errs, err)
			failed++
			continue
		}
		x := o.b.NewXfer(o.local.st)
		o.x, o.local.st = x, nil // the Xfer releases the local ref now
		start, deadline := times.get()
		o.deadline = deadline
		if err := m.fill(ctx, x, o, start, deadline); err != nil {
			// Nothing of the op was posted: it ends here, not in a
			// next part that would try again.
			x.Release()
			o.x = nil
			o.failed(err)
			errs = append(errs, err)
			failed++
			continue
		}
		chunks += int((o.remote.n + o.b.Chunk - 1) / o.b.Chunk) // every part's
		if o.peer != nil && !m.shmCopiesItself(o) {
			o.peer.wakeOwner(start) // as the op goes out: the owner looks for it from now on
		}
		if err := x.Submit(); err != nil {
			o.failed(ErrClosed)
			errs = append(errs, fmt.Errorf("%s over %s: %w", o.op, o.b.Provider, ErrClosed))
			failed++
			continue
		}
		o.submitted = true
	}
	copies := hasCopies(ops)
	if copies {
		m.copying.Add(1) // under the hold: a Close that has the manager waits for it
	}
	m.releaseManager()
	nudgeLoops(ops)
	// Same-manager and cma ops are copies, done while the others fly.
	lim := route.Limit{Ctx: ctx, Quit: m.quit}
	if !copiesOnly(ops) {
		lim.Start, lim.Deadline = times.get()
	}
	start, deadline := lim.Start, lim.Deadline
	if copies {
		var copyFailed int
		errs, copyFailed = m.runCopies(lim, ops, errs)
		failed += copyFailed
	}
	attempted := 0
	for i := range ops {
		o := &ops[i]
		for o.x != nil { // each part of the op
			j := o.x.Job()
			victim := false
			if o.submitted {
				err := o.b.Wait(ctx, o.x)
				if err == nil && o.b.Provider == fabric.BackendTCP {
					// o.x changes when the job is posted again.
					o.x, victim, err = o.b.RedoAfterDrop(ctx, o.x, start, deadline, func(old *libfabric.Xfer) (*libfabric.Xfer, error) {
						return m.resubmit(ctx, o, old, start, deadline)
					})
					j = o.x.Job()
				}
				if err != nil {
					// The job stays the loop's (wedged, or left at the
					// deadline), and so does the loop's hold on the xfer:
					// what it holds stays until the loop's call returns
					// and the job ends. The waiter's hold goes now, or
					// nothing would release the buffer once a wedge
					// clears. Its chunks, posted or not, are the loop's:
					// none is reported as not attempted (they were set
					// before Submit, and the loop does not write them;
					// read before the release, after which the xfer may
					// serve another request).
					attempted += len(j.Chunks)
					var we *progress.WedgedError
					if errors.As(err, &we) {
						o.x.Release() // its ops wait for a call that may never return
						failed++
					} else {
						o.x.ReleaseLeft()
					}
					o.failed(err)
					errs = append(errs, err)
					o.x, o.submitted = nil, false
					break
				}
			}
			attempted += j.Attempted
			first := len(errs)
			for _, e := range j.Errs {
				o.failed(e)
				errs = append(errs, e)
				var te *progress.TimeoutError
				if !errors.As(e, &te) {
					failed++
				}
			}
			if o.b.Provider == fabric.BackendTCP {
				if why := libfabric.Explain(j, o.ep.name, victim); why != nil {
					// Not a chunk: the explanation, ahead of the job's
					// errors so that the message leads with it. It is the
					// op's error too: its class (the owner refused, or is
					// gone) is what the raw completions do not say.
					errs = slices.Insert(errs, first, why)
					if !errors.Is(why, ErrTimeout) {
						// A deadline that cut the question short says
						// nothing of the rail (railFault): the chunks'
						// errors stand for it.
						o.fail = why
					}
				}
			}
			if err := m.nextPart(o, lim); err != nil {
				o.failed(err)
				errs = append(errs, err)
				var te *progress.TimeoutError
				if !errors.As(err, &te) {
					failed++
				}
			}
		}
	}
	releaseOps(ops)
	if len(errs) == 0 {
		return nil
	}
	for _, err := range errs {
		if m.replaceStuckShm(err) {
			break
		}
	}
	m.closedErrs(errs)
	return &TransferError{Op: kind, Bytes: total, Ops: len(ops), Chunks: chunks, Failed: failed,
		NotAttempted: max(0, chunks-attempted), Errs: errs}
}

// closedErrs makes the errors of jobs that a closing manager's loops
// failed (progress.ErrClosed), or that their waiters left to them closing
// (a progress.TimeoutError with Closing), say ErrClosed as well. A loop
// closed otherwise (a rail's replacement) keeps its own error.
func (m *Manager) closedErrs(errs []error) {
	if !m.closing.Load() {
		return
	}
	for i, err := range errs {
		var te *progress.TimeoutError
		closed := errors.Is(err, progress.ErrClosed) || errors.As(err, &te) && te.Closing
		if closed && !errors.Is(err, ErrClosed) {
			errs[i] = fmt.Errorf("%w: %w", ErrClosed, err)
		}
	}
}

// withQuit is ctx, done also once m closes (its cause then ErrClosed),
// and the func that lets go of it. A ctx that is never done adds nothing
// to m's own, and costs no allocation.
func (m *Manager) withQuit(ctx context.Context) (context.Context, func()) {
	if m.quitCtx == nil {
		return ctx, func() {}
	}
	if ctx.Done() == nil {
		return m.quitCtx, func() {}
	}
	c, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(m.quitCtx, func() { cancel(ErrClosed) })
	return c, func() {
		stop()
		cancel(nil)
	}
}

// reqTimes is a request's start, and its deadline (the context's, or
// the manager's timeout from the start), read from the clock at the first
// need: a request of copies no larger than a piece (mem, memcpy) has
// none, and for an 8 B mem op the read was an eighth of its time.
type reqTimes struct {
	ctx             context.Context
	timeout         time.Duration
	quit            <-chan struct{} // the manager's (Manager.quit); nil for none
	start, deadline time.Time
}

// get reads the clock the first time.
func (t *reqTimes) get() (start, deadline time.Time) {
	if t.start.IsZero() {
		t.start = time.Now()
		d, ok := t.ctx.Deadline()
		if !ok {
			d = t.start.Add(t.timeout)
		}
		t.deadline = d
	}
	return t.start, t.deadline
}

// waitFor waits until ch or or (nil: none) is closed, or until the
// request's context or deadline ends, or its manager closes: it then
// returns the context's error, or context.DeadlineExceeded at the
// deadline, or ErrClosed.
func (t *reqTimes) waitFor(ch, or <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-or:
		return nil
	default:
	}
	_, deadline := t.get()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-ch:
		return nil
	case <-or:
		return nil
	case <-t.ctx.Done():
		return t.ctx.Err()
	case <-timer.C:
		return context.DeadlineExceeded
	case <-t.quit:
		return ErrClosed
	}
}

// err is the context's error, or context.DeadlineExceeded once the
// deadline passed, or ErrClosed once the manager closes, or nil.
func (t *reqTimes) err() error {
	if err := t.ctx.Err(); err != nil {
		return err
	}
	select {
	case <-t.quit:
		return ErrClosed
	default:
	}
	if _, d := t.get(); !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// lockWithin takes mu, polling (a contended mu is rare and held for a
// round trip to an owner, or a libfabric call), or returns the error of
// t's limits when they end first.
func lockWithin(mu interface{ TryLock() bool }, t *reqTimes) error {
	for pause := 20 * time.Microsecond; !mu.TryLock(); pause = min(2*pause, time.Millisecond) {
		if err := t.err(); err != nil {
			return err
		}
		time.Sleep(pause)
	}
	return nil
}

// nudgeLoops wakes the loops of the endpoints a request's ops went out
// on when it does something else before it waits for them (copies, or
// ops on another endpoint: it waits in order). Such a loop may be pausing
// between its waiters' ops: 2.x's Outgoing shm endpoints
// (progress.Loop.ServesNoPeers), a passive loop handing off to its
// callers, a loop a waiter drove; an op would wait for the pause's end
// instead of flying meanwhile. A request on one endpoint alone drives or
// kicks it from its first wait.
func nudgeLoops(ops []opSpec) {
	if len(ops) < 2 {
		return
	}
	var first *libfabric.Route
	mixed := false
	for i := range ops {
		switch o := &ops[i]; {
		case o.kind != route.Fabric:
			mixed = true
		case first == nil:
			first = o.b
		case o.b != first:
			mixed = true
		}
	}
	if !mixed {
		return
	}
	var last *libfabric.Route
	for i := range ops {
		if o := &ops[i]; o.submitted && o.b != last {
			o.b.Nudge()
			last = o.b
		}
	}
}

// runCopies runs the ops this process copies itself (memcpy, cma, mem),
// counted in m.copying by the caller (under its hold of the manager),
// and appends their errors to errs; it returns errs and how many failed.
func (m *Manager) runCopies(lim route.Limit, ops []opSpec, errs []error) ([]error, int) {
	defer m.copying.Add(-1)
	failed := 0
	for i := range ops {
		o := &ops[i]
		if o.kind == route.Memcpy {
			if err := memcpy.Copy(lim, o.op, o.local.st.mem[o.local.off:o.local.off+o.remote.n],
				o.target.mem[o.remote.off:o.remote.off+o.remote.n]); err != nil {
				o.failed(err)
				errs = append(errs, err)
				failed++
			}
		}
	}
	var cmaFailed, memFailed int
	errs, cmaFailed = m.runCMA(lim, ops, errs)
	errs, memFailed = m.runMem(lim, ops, errs)
	return errs, failed + cmaFailed + memFailed
}

// hasCopies reports whether a request copies itself (memcpy, cma, mem).
func hasCopies(ops []opSpec) bool {
	for i := range ops {
		if k := ops[i].kind; k == route.Memcpy || k == route.CMA || k == route.Mem {
			return true
		}
	}
	return false
}

// copiesOnly reports whether every op is a copy (same manager, mem) that
// moves in one piece: those two routes look at the request's limit only
// between pieces (route.Piece), so these never need its start or
// deadline. (cma looks before its first chunk: a cma op needs them.)
func copiesOnly(ops []opSpec) bool {
	for i := range ops {
		if k := ops[i].kind; k != route.Memcpy && k != route.Mem || ops[i].remote.n > route.Piece {
			return false
		}
	}
	return true
}

// prepare takes the local references, routes every op and checks it
// against the handle and (shm, memcpy) against the owner's own record.
// Nothing has moved when it fails.
func (m *Manager) prepare(ctx context.Context, times *reqTimes, ops []opSpec) (err error) {
	// The checks' slice is pooled, and taken only for a first check: most
	// requests need none (mem, cma, tcp), and the pool's round was a
	// twentieth of an 8 B mem op.
	var pooled *[]guardCheck
	var checks []guardCheck
	// reached counts the ops whose local buffer prepare referenced. When it
	// fails, the ops after them hold no reference, and releaseOps must not
	// let go of one: the buffer's count would fall below its transfers in
	// flight, and its Close would not wait for them.
	reached := 0
	defer func() {
		if err != nil {
			for i := reached; i < len(ops); i++ {
				ops[i].local.st = nil
			}
		}
		if pooled != nil {
			for _, c := range checks {
				if c.link != nil {
					c.link.drop() // shmCheckKept's hold
				}
			}
			clear(checks)
			*pooled = checks[:0]
			guardChecks.Put(pooled)
		}
	}()
	var cmaSeen cmaEntries
	for i := range ops {
		o := &ops[i]
		if o.local.st == nil || o.local.st.m != m {
			o.local.st = nil
			return fmt.Errorf("%s: %w", o.op, ErrForeignBuffer)
		}
		if err := o.local.st.ref(); err != nil {
			o.local.st = nil
			return fmt.Errorf("%s: local %w", o.op, err)
		}
		reached = i + 1
		if o.local.st.left.Load() > 0 {
			if err := o.local.st.awaitLeft(times); err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					err = fmt.Errorf("%w (%w)", ErrTimeout, err)
				}
				return fmt.Errorf("%s: %w, waiting for the ops an earlier request left in flight on the local buffer (its deadline or cancel came first; they may still write it): nothing moved", o.op, err)
			}
		}
		if h := m.memo(&o.remote); h != nil {
			if mm, ok := h.take(o.op, o.local.st, &o.remote); ok {
				// The route the handle remembers: held as takeMem holds.
				o.kind, o.ep, o.peer, o.link, o.mm = route.Mem, &o.remote.eps[0], h.peer, h.link, mm
				continue
			}
		}
		rt, err := m.route(&o.remote, o.pin, times)
		if rt.gone != nil {
			rt.gone.Op = o.op
		}
		if err != nil {
			if to := awaited(err, o, times); to != nil {
				return to
			}
			return fmt.Errorf("%s: %w", o.op, err)
		}
		b, ep := rt.b, rt.ep
		if rt.kind == route.Fabric && b.Outgoing {
			if b, err = m.holdShm(o, b, ep.name, times); err != nil {
				return holdErr(o, err, rt.b.Addr(ep.name))
			}
		}
		o.kind, o.b, o.ep, o.peer = rt.kind, b, ep, rt.peer
		if !o.remote.access.Allows(need(o.op)) {
			return fmt.Errorf("%s: %w: the handle grants %s", o.op, ErrAccessDenied, o.remote.access)
		}
		if o.kind == route.Mem && o.local.st.iface != mr.Host {
			// Device memory cannot be copied by the CPU: cma, then shm.
			o.kind, o.ep = route.CMA, o.remote.endpoint(cma.Name)
			if o.ep == nil {
				o.ep = o.remote.endpoint(mem.Name) // only its guard part serves the shm check below
			}
		}
		if o.kind == route.CMA && o.local.st.iface != mr.Host {
			// process_vm_* cannot reach device memory: shm, if both have it.
			sn := m.backends().sameNode
			if sn == nil || o.remote.endpoint(sn.Name()) == nil || o.peer.shmName == nil {
				return fmt.Errorf("%s: %w: no same-node path for device memory to this peer (both need shm with FI_HMEM)", o.op, ErrDeviceMemory)
			}
			if why := o.peer.shmMismatch(sn); why != "" {
				return fmt.Errorf("%s: %w: no same-node path for device memory to this peer: %s", o.op, ErrDeviceMemory, why)
			}
			o.ep = o.remote.endpoint(sn.Name())
			out, err := m.holdShm(o, m.backends().shmOutgoing(), o.ep.name, times)
			if err != nil {
				return holdErr(o, err, sn.Addr(o.ep.name))
			}
			o.kind, b, o.b = route.Fabric, out, out
			if err := matchesPeer(&o.remote, o.ep, o.peer); err != nil {
				return fmt.Errorf("%s: %w", o.op, err) // route checked the handle's cma part only
			}
		}
		if o.kind == route.Fabric && o.peer != nil {
			o.peer.usesShm() // before the first shm op: it may need the owner's progress
			o.peer.tellOut(o.b)
		}
		switch {
		case o.kind == route.Memcpy:
			if o.local.st.iface != mr.Host {
				return fmt.Errorf("%s: %w: copies between buffers of one manager need host memory", o.op, ErrDeviceMemory)
			}
			if err := rt.owner.bindTarget(o); err != nil {
				return err
			}
		case o.kind == route.CMA:
			if err := m.cmaCheck(o, &cmaSeen); err != nil {
				return err
			}
		case o.kind == route.Mem:
			if err := m.takeMem(times, o, rt); err != nil {
				if to := awaited(err, o, times); to != nil {
					return to
				}
				return err
			}
		case b.Scratch != nil:
			if ep.guard == nil {
				return fmt.Errorf("%s: %w: shm endpoint without guard entry", o.op, ErrBadHandle)
			}
			if done, err := m.shmCheckDirect(o, &cmaSeen); done {
				if err != nil {
					return err
				}
				continue
			}
			c := guardCheck{op: i}
			if done, err := m.shmCheckKept(o, &c); done {
				if err != nil {
					return err
				}
				continue
			}
			if pooled == nil {
				pooled = guardChecks.Get().(*[]guardCheck)
				checks = (*pooled)[:0]
			}
			checks = append(checks, c)
		}
	}
	if len(checks) == 0 {
		return nil
	}
	start, deadline := times.get()
	// The checks wait for their reads under the manager's read hold:
	// Close, which waits for that hold, ends them as it ends the other
	// waits there, instead of at the request's deadline.
	cctx, stop := m.withQuit(ctx)
	err = m.verifyGuards(cctx, start, deadline, ops, checks)
	stop()
	if err != nil {
		if ctx.Err() == nil && context.Cause(cctx) == ErrClosed && errors.Is(err, context.Canceled) {
			return fmt.Errorf("%s: %w: the manager closed while the request waited for the owner's guard entry (its handle check; nothing moved)", ops[0].op, ErrClosed)
		}
		return err
	}
	for _, c := range checks {
		if c.err != nil {
			return c.err
		}
	}
	return nil
}

// bindTarget resolves a handle of one of m's buffers to the buffer, and
// checks it as m, its owner, would.
func (m *Manager) bindTarget(o *opSpec) error {
	r := &o.remote
	m.bufsMu.Lock()
	st := m.bufs[r.id]
	m.bufsMu.Unlock()
	if st == nil {
		return fmt.Errorf("%s: %w: buffer %d is closed", o.op, ErrStaleHandle, r.id)
	}
	if len(st.eps) != len(r.eps) {
		return fmt.Errorf("%s: %w: buffer %d does not match the handle", o.op, ErrStaleHandle, r.id)
	}
	for i := range st.eps {
		if st.eps[i].key != r.eps[i].key || st.eps[i].base != r.eps[i].base {
			return fmt.Errorf("%s: %w: key or address of buffer %d do not match", o.op, ErrStaleHandle, r.id)
		}
	}
	if st.size != r.size && r.off+r.n > st.size {
		return fmt.Errorf("%s: %w: the handle's range [%d, %d) lies outside buffer %d's %d bytes (the handle was altered)",
			o.op, ErrOutOfRange, r.off, r.off+r.n, r.id, st.size)
	}
	if st.size != r.size {
		return fmt.Errorf("%s: %w: size of buffer %d does not match the handle", o.op, ErrStaleHandle, r.id)
	}
	if !st.access.Allows(need(o.op)) {
		return fmt.Errorf("%s: %w: buffer %d was registered %s", o.op, ErrAccessDenied, r.id, st.access)
	}
	if st.iface != mr.Host {
		return fmt.Errorf("%s: %w: copies between buffers of one manager need host memory", o.op, ErrDeviceMemory)
	}
	if err := st.ref(); err != nil {
		return fmt.Errorf("%s: remote %w", o.op, err)
	}
	o.target = st
	return nil
}

// notStarted is the error of a request whose context was done before it
// began: nothing moved.
func notStarted(kind string, ops []opSpec, err error) error {
	return notStartedBy(kind, ops, &progress.TimeoutError{Cause: err, NotStarted: true})
}

// notStartedBy is the error of a request that ended with the timeout to
// before any of its ops was posted.
func notStartedBy(kind string, ops []opSpec, to *progress.TimeoutError) error {
	var total uint64
	for i := range ops {
		total += ops[i].remote.n
	}
	return &TransferError{Op: kind, Bytes: total, Ops: len(ops), Errs: []error{to}}
}

// unstarted is err as op's *progress.TimeoutError when the request's
// limits ended before any of op was posted — while a libfabric call held
// the endpoint (Busy: progress.Loop.DoBy), or while it waited for
// something else first (Awaiting: a free scratch slot) — else nil.
func unstarted(err error, op progress.Op, peer string, n uint64, start time.Time) *progress.TimeoutError {
	var te *progress.TimeoutError
	if !errors.As(err, &te) || !te.Busy && te.Awaiting == "" {
		return nil
	}
	out := *te
	out.Op, out.Peer, out.Bytes, out.After = op, peer, n, time.Since(start)
	return &out
}

// goneFor is err, PeerBy's *progress.PeerGoneError for a peer whose shm
// endpoint is gone, with the op it stopped, or nil for another error:
// PeerBy does not know the op.
func goneFor(err error, op progress.Op) *progress.PeerGoneError {
	g, ok := err.(*progress.PeerGoneError)
	if !ok {
		return nil
	}
	c := *g
	c.Op = op
	return &c
}

// awaited is op o's *progress.TimeoutError when err says that its
// request's limits ended while it waited for a same-node owner's answer
// (*awaitError), else nil (a manager that closed meanwhile is ErrClosed).
func awaited(err error, o *opSpec, t *reqTimes) *progress.TimeoutError {
	var ae *awaitError
	if !errors.As(err, &ae) || errors.Is(ae.cause, ErrClosed) {
		return nil
	}
	start, _ := t.get()
	return &progress.TimeoutError{Op: o.op, Provider: ae.provider, Peer: cma.Peer(ae.pid), Bytes: o.remote.n,
		After: time.Since(start), Cause: ae.cause, Awaiting: ae.what}
}

// fill builds the job of a network op: chunks no larger than the
// backend's limit, the peer's address, the completion level. Inserting
// the peer's address or registering the local buffer on the endpoint
// waits for the endpoint within the request's ctx and deadline.
func (m *Manager) fill(ctx context.Context, x *libfabric.Xfer, o *opSpec, start, deadline time.Time) error {
	b := o.b
	p, err := b.PeerBy(ctx, deadline, o.ep.name)
	if err != nil {
		if te := unstarted(err, o.op, b.Addr(o.ep.name), o.remote.n, start); te != nil {
			return te
		}
		if gone := goneFor(err, o.op); gone != nil {
			return gone
		}
		return fmt.Errorf("%s over %s: %w", o.op, b.Provider, err)
	}
	pid := 0
	if o.peer != nil {
		pid = o.peer.pid
	}
	x.Aim(p, o.op, start, deadline, pid) // x holds p until its job is idle
	j := x.Job()
	if o.op == progress.Write {
		reaches := o.peer != nil && b.Provider == fabric.BackendSHM && m.reach.Reaches(o.peer.pid, o.peer.cma.table)
		j.Flags = b.WriteFlags(b.Completion(m.cfg.transmitComplete, o.sourceFree, o.remote.n), o.peer != nil, reaches)
	}
	st := x.Local().(*bufState)
	lv := view{st, o.local.off, o.local.n}
	desc, err := st.desc(ctx, deadline, b)
	if err != nil {
		if te := unstarted(err, o.op, p.Name(), o.remote.n, start); te != nil {
			return te
		}
		return fmt.Errorf("%s over %s: registering the local buffer on this endpoint: %w", o.op, b.Provider, err)
	}
	remote := o.ep.base + o.remote.off
	end := o.remote.n
	if b.Provider == fabric.BackendSHM {
		end = min(end, o.sent+shmPart)
	}
	for off := o.sent; off < end; off += b.Chunk {
		n := min(b.Chunk, end-off)
		j.Chunks = append(j.Chunks, progress.Chunk{Local: lv.ptr(off), Desc: desc, Len: n,
			Remote: remote + off, Key: o.ep.key, Offset: off})
	}
	o.sent = end
	if b.Provider == fabric.BackendSHM && o.peer != nil {
		l := m.checksLink(o)
		if l == nil {
			// The link route required ended since: the owner's Close
			// would not wait for this part (markShmPart).
			return m.linkEndedErr(o.op, b.Name(), o.peer, nil)
		}
		// The job ends when its buffer does; x drops the hold on l at its
		// last release.
		x.WatchGen(l.genWord(o.ep.guard.slot), o.ep.guard.gen, l)
		return m.markShmPart(x, o, l)
	}
	return nil
}

// shmPart is the most one shm job of an op covers; a longer op runs as
// consecutive jobs, and the request's context and deadline are checked
// between them. libfabric 1.x's shm copies inside fi_read / fi_write on
// its single-copy path, so a progress loop posting a batch of large
// chunks cannot look at the deadline until all of them are copied: a
// 1 GiB read with a 20 ms deadline returned after 3.6 s. A part bounds
// that, at the cost of one pause in the pipeline per part where the
// owner copies instead.
const shmPart = 32 << 20

// nextPart releases the finished job of op o and, when that job was one
// part of a longer op (shmPart) and did not fail, starts the next part —
// unless the request's context or deadline ended, which is the error it
// returns then.
func (m *Manager) nextPart(o *opSpec, lim route.Limit) error {
	x := o.x
	more := len(x.Job().Errs) == 0 && o.sent < o.remote.n
	peer, start := x.Job().PeerName, x.Job().Start
	var next *libfabric.Xfer
	var stop error
	if more {
		stop = lim.Err() // a clock read: only between parts
	}
	if more && stop == nil {
		st := x.Local().(*bufState)
		st.hold() // before x lets go of it
		next = o.b.NewXfer(st)
	}
	if len(x.Job().Errs) > 0 {
		x.ReleaseLeft() // a chunk that failed may have left others in flight
	} else {
		x.Release()
	}
	o.x, o.submitted = nil, false
	switch {
	case !more:
		return nil
	case stop != nil:
		return lim.Timeout(o.op, string(o.b.Provider), peer, o.remote.n, o.sent, o.b.Chunk, stop)
	}
	if err := m.fill(lim.Ctx, next, o, start, lim.Deadline); err != nil {
		next.Release()
		return err
	}
	if err := next.Submit(); err != nil {
		next.Release()
		return fmt.Errorf("%s over %s: %w", o.op, o.b.Provider, ErrClosed)
	}
	o.x, o.submitted = next, true
	return nil
}

// releaseOps drops the references prepare took that no xfer holds.
func releaseOps(ops []opSpec) {
	for i := range ops {
		o := &ops[i]
		if o.local.st != nil {
			o.local.st.Unref()
			o.local.st = nil
		}
		if o.target != nil {
			o.target.Unref()
			o.target = nil
		}
		if o.mm != nil {
			o.mm.unref()
			o.mm = nil
		}
		if o.link != nil {
			o.link.drop() // prepareMem's hold
			o.link = nil
		}
		if o.held != nil {
			o.held.Unhold()
			o.held = nil
		}
	}
}
