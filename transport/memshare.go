package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// The memory route (internal/route/mem). An initiator that has verified a
// buffer's owner opens a second connection to the owner's verifier (the
// first one only watches that the owner lives) and asks over it, once,
// for the owner's guard table (read-only) and a use page of its own, and
// then, once per buffer, for the buffer's memfd. The owner answers only
// a process the kernel says is of its uid, and shares a buffer only when
// the registration is a whole mr.Alloc allocation that peers may read;
// the file of a buffer peers may only read is opened read-only.

const (
	memCtlReq = "MCT1" // the guard table and a use page
	memMapReq = "MMP1" // + id u64, slot u32, gen u64: a buffer's file
	memReply  = "MRE1" // + status u8, size u64, why; files attached
	memMapLen = 4 + 8 + 4 + 8
	// useSlots is a use page's counters: one per guard slot.
	useSlots = guardSlots
	// maxMemMaps bounds the buffers an initiator keeps mapped per owner;
	// mappings of closed buffers go first.
	maxMemMaps = 1024
)

// ---- the owner's side ----

// memPeer is a verified process that asked for a use page: where its ops
// on this manager's buffers mark themselves.
type memPeer struct {
	pid   int
	pidfd int // -1 when pidfd_open failed: proc.Gone then
	page  []byte
	uses  mem.Uses
}

// dead reports whether the process exited: its marks no longer count.
func (p *memPeer) dead() bool {
	if p.pidfd >= 0 {
		fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0 && fds[0].Revents&unix.POLLIN != 0
	}
	gone, _ := proc.Gone(p.pid)
	return gone
}

func (p *memPeer) release() {
	_ = mr.Free(p.page)
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
}

// memPeers are the owner's memPeers.
type memPeers struct {
	mu   sync.Mutex
	list []*memPeer
}

// serveMem answers the mem requests of a verified peer, process pid, on
// its connection c until it ends.
func (m *Manager) serveMem(c *net.UnixConn, pid int) {
	var peer *memPeer
	defer func() {
		if peer != nil {
			m.memPeers.ended(peer)
		}
	}()
	b := make([]byte, 64)
	for {
		n, err := c.Read(b)
		if err != nil {
			return
		}
		req := b[:n]
		switch {
		case !m.memOn:
			err = memAnswer(c, "this manager does not share memory (the mem route is off)", 0)
		case string(req) == memCtlReq && peer == nil:
			peer, err = m.newMemPeer(c, pid)
		case len(req) == memMapLen && string(req[:4]) == memMapReq && peer != nil:
			id, slot, gen := binary.LittleEndian.Uint64(req[4:]), binary.LittleEndian.Uint32(req[12:]), binary.LittleEndian.Uint64(req[16:])
			fd, size, why := m.shareBuffer(id, slot, gen)
			err = memAnswer(c, why, size, fd)
			if fd >= 0 {
				_ = unix.Close(fd)
			}
		default:
			err = memAnswer(c, "unknown or out-of-order request", 0)
		}
		if err != nil {
			return
		}
	}
}

// newMemPeer makes pid's use page and sends it with the guard table.
func (m *Manager) newMemPeer(c *net.UnixConn, pid int) (*memPeer, error) {
	page, err := mr.Alloc(useSlots * 4)
	if err != nil {
		return nil, memAnswer(c, "no use page: "+err.Error(), 0)
	}
	p := &memPeer{pid: pid, pidfd: -1, page: page, uses: mem.UsesOf(page)}
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		p.pidfd = fd
	}
	useFD, _, err1 := mr.File(page, false)
	guardFD, ok, err2 := mr.File(m.guard.mem, true)
	if err1 != nil || err2 != nil || !ok {
		p.release()
		if useFD >= 0 {
			_ = unix.Close(useFD)
		}
		if guardFD >= 0 {
			_ = unix.Close(guardFD)
		}
		return nil, memAnswer(c, "the guard table or the use page has no file", 0)
	}
	m.memPeers.mu.Lock()
	m.memPeers.list = append(m.memPeers.list, p)
	m.memPeers.mu.Unlock()
	err = memAnswer(c, "", 0, guardFD, useFD)
	_ = unix.Close(guardFD)
	_ = unix.Close(useFD)
	return p, err
}

// shareBuffer opens the file of buffer id, as the handle the peer holds
// names it (guard slot and generation), or says why not.
func (m *Manager) shareBuffer(id uint64, slot uint32, gen uint64) (fd int, size uint64, why string) {
	m.bufsMu.Lock()
	st := m.bufs[id]
	m.bufsMu.Unlock()
	if st == nil || st.ref() != nil {
		return -1, 0, "the buffer is closed"
	}
	defer st.Unref()
	switch {
	case !st.hasGrd || st.guard != slot || m.guard.gen(slot) != gen:
		return -1, 0, "the handle is not the buffer's current one"
	case !st.shared:
		return -1, 0, "the buffer is not shared: not a whole mr.Alloc allocation peers may read"
	}
	fd, ok, err := mr.File(st.mem, !st.access.Allows(mr.RemoteWrite))
	if err != nil || !ok {
		return -1, 0, fmt.Sprintf("the buffer's file: %v", err)
	}
	return fd, st.size, ""
}

// memAnswer sends a reply: why is empty on success; fds go along.
func memAnswer(c *net.UnixConn, why string, size uint64, fds ...int) error {
	b := make([]byte, 0, 13+len(why))
	b = append(b, memReply...)
	status := byte(0)
	if why != "" {
		status = 1
	}
	b = append(b, status)
	b = binary.LittleEndian.AppendUint64(b, size)
	b = append(b, why...)
	var oob []byte
	if len(fds) > 0 && fds[0] >= 0 {
		oob = unix.UnixRights(fds...)
	}
	_ = c.SetWriteDeadline(time.Now().Add(verifyTimeout))
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

// ended drops a peer whose connection ended, unless its marks may still
// count: a live process that left a mark keeps its page until it exits.
func (ps *memPeers) ended(p *memPeer) {
	if !p.dead() && !idle(p.uses) {
		return
	}
	ps.mu.Lock()
	for i, q := range ps.list {
		if q == p {
			ps.list = append(ps.list[:i], ps.list[i+1:]...)
			break
		}
	}
	ps.mu.Unlock()
	p.release()
}

func idle(u mem.Uses) bool {
	for i := range u {
		if u.InUse(uint32(i)) {
			return false
		}
	}
	return true
}

// wait waits until no live peer marks an op on slot's buffer, or until
// deadline; it returns the processes still marked then.
func (ps *memPeers) wait(slot uint32, deadline time.Time) []int {
	ps.mu.Lock()
	list := append([]*memPeer(nil), ps.list...)
	ps.mu.Unlock()
	var busy []int
	for _, p := range list {
		for pause := time.Microsecond; p.uses.InUse(slot) && !p.dead(); pause = min(2*pause, time.Millisecond) {
			if time.Now().After(deadline) {
				busy = append(busy, p.pid)
				break
			}
			time.Sleep(pause) // an op is a copy: it ends within a piece's time
		}
	}
	return busy
}

// close releases every peer's page; the verifier is closed.
func (ps *memPeers) close() {
	ps.mu.Lock()
	list := ps.list
	ps.list = nil
	ps.mu.Unlock()
	for _, p := range list {
		p.release()
	}
}

// ---- the initiator's side ----

// memLink is this manager's mem route to one verified owner.
type memLink struct {
	owner *sameNodePeer
	mu    sync.Mutex // one request at a time on conn
	conn  *net.UnixConn
	guard []byte   // the owner's guard table, read-only
	words []uint64 // guard, word by word
	page  []byte   // this manager's use page at the owner
	uses  mem.Uses
	maps  map[uint64]*memMap // by buffer id; under mu
	done  atomic.Bool        // closed: the owner is gone or this manager closes
}

// memMap is one buffer of the owner, mapped here. Its mapping goes when
// the link drops it and no op uses it.
type memMap struct {
	b        []byte
	gen      uint64
	slot     uint32
	writable bool
	refs     atomic.Int32 // the link's one, and one per op using it
}

func (mm *memMap) unref() {
	if mm.refs.Add(-1) == 0 {
		mem.Unmap(mm.b)
	}
}

// errMemRefused: the owner does not share the buffer; another route may.
var errMemRefused = errors.New("the owner does not share it")

// memLink returns the link to p, setting it up at the first call.
func (p *sameNodePeer) memLink(owner ID) (*memLink, error) {
	p.memOnce.Do(func() { p.link, p.linkErr = dialMem(p, owner) })
	if p.linkErr != nil {
		return nil, p.linkErr
	}
	if p.link.done.Load() {
		return nil, peerGone(p.pid)
	}
	return p.link, nil
}

// dialMem opens the mem connection to p, checks that the kernel says it
// is p's process, and asks for the guard table and a use page.
func dialMem(p *sameNodePeer, owner ID) (*memLink, error) {
	d := net.Dialer{Timeout: verifyTimeout}
	nc, err := d.Dial("unixpacket", verifySocket(owner))
	if err != nil {
		return nil, fmt.Errorf("%w (%v)", errNoAnswer, errors.Unwrap(err))
	}
	c := nc.(*net.UnixConn)
	fail := func(format string, a ...any) (*memLink, error) {
		_ = c.Close()
		return nil, fmt.Errorf("mem route to process %d: "+format, append([]any{p.pid}, a...)...)
	}
	cred, err := peerCred(c)
	if err != nil || int(cred.Pid) != p.pid {
		return fail("the verifier socket is not its process's any more")
	}
	_ = c.SetReadDeadline(time.Now().Add(verifyTimeout))
	b := make([]byte, proofMaxSize+1)
	n, err := c.Read(b)
	if err != nil {
		return fail("no answer: %v", err)
	}
	var again sameNodePeer
	if pid, err := parseProof(b[:n], &again); err != nil || pid != p.pid || again.cma != p.cma {
		return fail("it answers as another manager")
	}
	l := &memLink{owner: p, conn: c, maps: map[uint64]*memMap{}}
	_, fds, err := l.ask([]byte(memCtlReq), 2)
	if err != nil {
		return fail("%v", err)
	}
	gm, _, err := mem.Map(fds[0], guardSlots*guardEntrySize, false)
	if err != nil {
		_ = unix.Close(fds[1])
		return fail("its guard table: %v", err)
	}
	pm, writable, err := mem.Map(fds[1], useSlots*4, true)
	if err != nil || !writable {
		mem.Unmap(gm)
		mem.Unmap(pm)
		return fail("its use page: %v", err)
	}
	l.guard, l.words, l.page, l.uses = gm, mr.Words64(gm), pm, mem.UsesOf(pm)
	return l, nil
}

// ask sends a request and reads the answer, with the files it carries
// (want of them on success). Under l.mu or before l is shared.
func (l *memLink) ask(req []byte, want int) (size uint64, fds []int, err error) {
	_ = l.conn.SetDeadline(time.Now().Add(verifyTimeout))
	if _, err := l.conn.Write(req); err != nil {
		return 0, nil, err
	}
	b := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := l.conn.ReadMsgUnix(b, oob)
	if err != nil {
		return 0, nil, err
	}
	if cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for _, cm := range cmsgs {
			if got, err := unix.ParseUnixRights(&cm); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if flags&unix.MSG_CTRUNC != 0 || n < 13 || string(b[:4]) != memReply {
		closeAll()
		return 0, nil, errors.New("a malformed answer")
	}
	if b[4] != 0 {
		closeAll()
		return 0, nil, fmt.Errorf("%w: %s", errMemRefused, b[13:n])
	}
	if len(fds) != want {
		closeAll()
		return 0, nil, fmt.Errorf("an answer with %d files, not %d", len(fds), want)
	}
	return binary.LittleEndian.Uint64(b[5:]), fds, nil
}

// entry is the guard entry of slot, as the owner's table holds it now.
func (l *memLink) entry(slot uint32) (e [guardEntrySize]byte) {
	for w := 0; w < guardEntrySize/8; w++ {
		binary.LittleEndian.PutUint64(e[8*w:], atomic.LoadUint64(&l.words[int(slot)*guardEntrySize/8+w]))
	}
	return e
}

// gen is slot's generation now.
func (l *memLink) gen(slot uint32) uint64 { return atomic.LoadUint64(l.genWord(slot)) }

// genWord is slot's generation word in the owner's table.
func (l *memLink) genWord(slot uint32) *uint64 { return &l.words[int(slot)*guardEntrySize/8+gwGen] }

// get returns the mapping of the handle's buffer, holding it for one op:
// from the ones mapped, or asked for now. The guard entry was checked.
func (l *memLink) get(r *RemoteBuffer, g *guardRef) (*memMap, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done.Load() {
		return nil, peerGone(l.owner.pid)
	}
	if mm := l.maps[r.id]; mm != nil && mm.gen == g.gen {
		mm.refs.Add(1)
		return mm, nil
	}
	l.sweep()
	req := make([]byte, 0, memMapLen)
	req = append(req, memMapReq...)
	req = binary.LittleEndian.AppendUint64(req, r.id)
	req = binary.LittleEndian.AppendUint32(req, g.slot)
	req = binary.LittleEndian.AppendUint64(req, g.gen)
	size, fds, err := l.ask(req, 1)
	if errors.Is(err, errMemRefused) {
		// The owner shares what its handles say it shares: a refusal
		// is a handle that is no longer its buffer's.
		return nil, fmt.Errorf("%w: buffer %d: %v", ErrStaleHandle, r.id, err)
	}
	if err != nil {
		return nil, err
	}
	if size != r.size {
		_ = unix.Close(fds[0])
		return nil, fmt.Errorf("%w: the owner's buffer %d holds %d bytes, the handle says %d", ErrStaleHandle, r.id, size, r.size)
	}
	b, writable, err := mem.Map(fds[0], int(size), r.access.Allows(mr.RemoteWrite))
	if err != nil {
		return nil, err
	}
	mm := &memMap{b: b, gen: g.gen, slot: g.slot, writable: writable}
	mm.refs.Store(2) // the link's and the op's
	if old := l.maps[r.id]; old != nil {
		old.unref()
	}
	l.maps[r.id] = mm
	return mm, nil
}

// sweep drops the mappings of buffers the owner closed since, and the
// oldest ones beyond maxMemMaps: a mapping keeps the owner's freed pages
// alive. Under l.mu.
func (l *memLink) sweep() {
	for id, mm := range l.maps {
		if l.gen(mm.slot) != mm.gen || len(l.maps) >= maxMemMaps {
			delete(l.maps, id)
			mm.unref()
		}
	}
}

// close drops every mapping (ops using one keep it until they end) and
// the connection.
func (l *memLink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done.Swap(true) {
		return
	}
	for id, mm := range l.maps {
		delete(l.maps, id)
		mm.unref()
	}
	_ = l.conn.Close()
	// The guard table and the use page stay mapped: an op may be between
	// its check and its mark. They are small, and go with the process.
}

// prepareMem checks a mem op against the owner's guard entry and takes
// the buffer's mapping for it.
func (m *Manager) prepareMem(o *opSpec) error {
	l, err := o.peer.memLink(o.remote.owner)
	if err != nil {
		return err
	}
	g := o.ep.guard
	e := l.entry(g.slot) // matchesPeer bounded the slot
	if err := checkEntry(e[:], &o.remote, o.ep, need(o.op), true); err != nil {
		return err
	}
	mm, err := l.get(&o.remote, g)
	if err != nil {
		return fmt.Errorf("%s: %w", o.op, err)
	}
	if o.op == progress.Write && !mm.writable {
		mm.unref()
		return fmt.Errorf("%s: %w: the owner shared buffer %d read-only", o.op, ErrAccessDenied, o.remote.id)
	}
	if o.remote.off+o.remote.n > uint64(len(mm.b)) {
		mm.unref()
		return fmt.Errorf("%s: %w: [%d, %d) outside buffer %d's %d bytes", o.op, ErrOutOfRange, o.remote.off, o.remote.off+o.remote.n, o.remote.id, len(mm.b))
	}
	o.link, o.mm = l, mm
	return nil
}

// runMem runs the request's mem ops and appends their errors to errs; it
// returns errs and how many ops failed.
func runMem(lim route.Limit, ops []opSpec, errs []error) ([]error, int) {
	failed := 0
	for i := range ops {
		o := &ops[i]
		if o.kind != route.Mem || o.mm == nil {
			continue
		}
		if err := memCopy(lim, o); err != nil {
			errs = append(errs, err)
			failed++
		}
		o.mm.unref()
		o.mm = nil
	}
	return errs, failed
}

// memCopy is one mem op: marked in the use page while it copies, and only
// while the owner has the buffer open and lives.
func memCopy(lim route.Limit, o *opSpec) error {
	l, g := o.link, o.ep.guard
	l.uses.Mark(g.slot)
	defer l.uses.Leave(g.slot)
	owner := mem.Owner{PID: o.peer.pid, Gen: l.genWord(g.slot), Want: g.gen, Gone: &o.peer.gone}
	err := owner.Open()
	if err == nil {
		local := o.local.st.mem[o.local.off : o.local.off+o.remote.n]
		err = mem.Copy(lim, o.op, local, o.mm.b[o.remote.off:o.remote.off+o.remote.n], &owner)
	}
	switch {
	case errors.Is(err, mem.ErrGone):
		e := peerGone(o.peer.pid)
		e.Op, e.Provider = o.op, mem.Name
		return e
	case errors.Is(err, mem.ErrClosed):
		return fmt.Errorf("%s: %w: buffer %d was closed by its owner", o.op, ErrStaleHandle, o.remote.id)
	}
	return err
}
