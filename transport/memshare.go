package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/internal/lifeline"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
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
	memCtlReq = "MCT1" // the generations page and a use page
	// memMapReq + id u64, slot u32, gen u64, key u64, base u64, size u64:
	// the file of the buffer a handle names, as the handle names it.
	memMapReq = "MMP1"
	// memReply + status u8, size u64, id u64, slot u32, gen u64 (echoed),
	// why; files attached.
	memReply    = "MRE1"
	memMapLen   = 4 + 8 + 4 + 8 + 8 + 8 + 8
	memReplyLen = 4 + 1 + 8 + 8 + 4 + 8
	// useSlots is a use page's counters: one per guard slot.
	useSlots = guardSlots
	// maxMemMaps bounds the buffers an initiator keeps mapped per owner;
	// mappings of closed buffers go first.
	maxMemMaps = 1024
	// memRedial is how long a refused or failed mem link stands before
	// the next op toward the owner dials again (meanwhile: its other
	// routes); one that timed out is dialed again verifyTimeout after
	// its dial began (redialDue).
	memRedial = time.Second
)

// maxMemPeers bounds the use pages (links) an owner hands out at once,
// one per peer manager, whatever route it takes (a variable for tests).
var maxMemPeers = 1024

// The statuses of a memReply.
const (
	memOK      = 0
	memStale   = 1 // the handle is not the buffer's current one
	memRange   = 2 // the handle's range lies outside the buffer
	memRefused = 3 // not shared, not a request this owner answers
)

// ---- the owner's side ----

// memPeer is a verified process that asked for a use page: where its ops
// on this manager's buffers mark themselves.
type memPeer struct {
	pid   int
	pidfd int // -1 when pidfd_open failed: proc.Gone then
	// mu: held for reading while the page or pidfd is used, for writing
	// to release them.
	mu       sync.RWMutex
	released bool
	page     []byte
	uses     mem.Uses
	// dev and ino name the use page's file (0, 0: unknown): a process
	// that still maps it may still mark an op in it (stillMaps).
	dev, ino uint64
}

// stillMaps reports whether the peer's process still maps its use page,
// as the kernel shows: until it unmaps it, an op of its own that held
// the link before the link ended may still mark the page (its ops end
// the link, then free the page once the last of them ends). An unknown
// file counts as mapped. Under p.mu (read).
func (p *memPeer) stillMaps() bool {
	return p.ino == 0 || proc.Maps(p.pid, p.dev, p.ino)
}

// dead reports whether the process exited: its marks no longer count.
// Under p.mu (read).
func (p *memPeer) dead() bool {
	if p.pidfd >= 0 {
		return proc.PidfdExited(p.pidfd)
	}
	gone, _ := proc.Gone(p.pid)
	return gone
}

// busy reports whether an op of the live peer on slot's buffer is marked.
func (p *memPeer) busy(slot uint32) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return !p.released && p.uses.InUse(slot) && !p.dead()
}

// droppable reports whether the peer's marks can no longer count: it
// exited, or it no longer maps the page. Idle alone is not enough: the
// connection's end does not tell that the peer stopped using the link
// (the owner ends it too, replacing its shm endpoint: dropPeers), and an
// op that marked the page after the owner dropped it would copy through a
// Buffer.Close that no longer looks at the page. A mark left on a page the
// peer unmapped counts for nothing: a peer's ops mark and clear it through
// that mapping, and it frees the page once the last of them ended, so
// only a peer that does not follow the protocol leaves one; kept, such
// peers held a page and a pidfd each, without bound (an attacker's
// review).
func (p *memPeer) droppable() bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.released || p.dead() || !p.stillMaps()
}

func (p *memPeer) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	_ = mr.Free(p.page)
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
}

// memPeers are the owner's memPeers.
type memPeers struct {
	mu    sync.Mutex
	list  []*memPeer
	ended []*memPeer // connection over, a mark left by a live process
	// waiting counts the waits under way (a Buffer.Close's); close lets
	// them end (each by its deadline) before it releases the peers'
	// pages, whose marks they read. idle signals their end.
	waiting int
	idle    *sync.Cond
}

// serveMem answers the mem requests of a verified peer, process pid, on
// its connection c until it ends.
//
// A peer that announces shm use on a connection (announceShm, no answer)
// may need this manager's progress at any time from then on (the first
// op of a new peer; every op where shm cannot copy with CMA): the shm
// loop polls until that connection ends, and looks at once when the peer
// says an op is on its way (announceWake).
func (m *Manager) serveMem(c *net.UnixConn, pid int) {
	var peer *memPeer
	release := func() {}
	var outs [][]byte            // the peer's Outgoing shm endpoints (announceOut)
	var reached *libfabric.Route // the first shm endpoint they reached: the one when the peer announced shm
	clean := false               // its manager closed with none of their ops in flight (announceClean)
	pidfd := -1                  // the peer's, once it announced shm: to tell its death from a new verification
	defer func() {
		release()
		if peer != nil {
			m.memPeers.end(peer)
		}
		switch {
		case clean:
			m.releaseIncoming(reached, outs, pid)
		case len(outs) > 0 && pidfd >= 0:
			m.leaveWhenGone(reached, outs, pidfd) // it closes pidfd
			pidfd = -1
		}
		if pidfd >= 0 {
			_ = unix.Close(pidfd)
		}
	}()
	attended, reset := false, false
	b := make([]byte, 64)
	for {
		n, err := c.Read(b)
		if errors.Is(err, unix.ECONNRESET) && !reset {
			// A peer that closes its end with messages of ours unread
			// (the proof) resets the connection, and the kernel reports
			// that before the messages the peer sent first, its
			// announceClean among them: they are still queued, and the
			// next reads return them, then the end.
			reset = true
			continue
		}
		if err != nil || n == 0 {
			return
		}
		req := b[:n]
		switch {
		case n == 1 && req[0] == announceShm:
			if !attended {
				attended, release = true, m.attendSameNode()
				reached = m.backends().sameNode
				if fd, err := unix.PidfdOpen(pid, 0); err == nil {
					pidfd = fd // the connection is up: pid is its process, not a reused number
				}
			}
		case n == 1 && req[0] == announceWake && attended:
			m.wakeSameNode() // no answer: the peer reads nothing on this connection
		case n > 1 && req[0] == announceOut && attended:
			// No answer either. Only names of the peer's own process, as
			// the kernel names it; each is freed when the peer says it
			// closed drained (announceDone), or as the connection ends
			// after announceClean.
			outs = m.noteOut(reached, outs, req[1:], pid)
		case n > 1 && req[0] == announceDone && attended:
			outs = m.doneOut(reached, outs, req[1:], pid) // no answer
		case n == 1 && req[0] == announceClean && attended:
			clean = true // no answer: the peer is closing
		case string(req) == memCtlReq && peer == nil:
			peer, err = m.newMemPeer(c, pid)
		case !m.memOn:
			err = memAnswer(c, memRefused, "this manager does not share memory (the mem route is off)", 0, nil)
		case len(req) == memMapLen && string(req[:4]) == memMapReq && peer != nil:
			fd, status, size, why := m.shareBuffer(req[4:])
			err = memAnswer(c, status, why, size, req[4:24], fd)
			if fd >= 0 {
				_ = unix.Close(fd)
			}
		default:
			err = memAnswer(c, memRefused, "unknown or out-of-order request", 0, nil)
		}
		if err != nil {
			return
		}
	}
}

// newMemPeer makes pid's use page and sends it with the generations page.
func (m *Manager) newMemPeer(c *net.UnixConn, pid int) (*memPeer, error) {
	if m.memPeers.full() {
		return nil, memAnswer(c, memRefused, fmt.Sprintf("the owner has no use page left: it links at most %d peer managers at once, and each link holds one until it ends", maxMemPeers), 0, nil)
	}
	page, err := mr.AllocControl(useSlots * 4)
	if err != nil {
		return nil, memAnswer(c, memRefused, "no use page: "+err.Error(), 0, nil)
	}
	p := &memPeer{pid: pid, pidfd: -1, page: page, uses: mem.UsesOf(page)}
	if fd, err := unix.PidfdOpen(pid, 0); err == nil {
		p.pidfd = fd
	}
	useFD, ok1, err1 := mr.File(page, false)
	gensFD, ok2, err2 := mr.File(m.guard.gens, true)
	var st unix.Stat_t
	if err1 == nil && ok1 && unix.Fstat(useFD, &st) == nil {
		p.dev, p.ino = st.Dev, st.Ino
	}
	if err1 != nil || err2 != nil || !ok1 || !ok2 {
		p.release()
		for _, fd := range []int{useFD, gensFD} {
			if fd >= 0 {
				_ = unix.Close(fd)
			}
		}
		return nil, memAnswer(c, memRefused, "the generations or the use page has no file", 0, nil)
	}
	m.memPeers.mu.Lock()
	m.memPeers.list = append(m.memPeers.list, p)
	m.memPeers.mu.Unlock()
	// The size says where the lifeline is, for peers that know of it:
	// older ones read none.
	var withLife uint64
	if m.guard.life != nil {
		withLife = lifeOffset + lifeline.Size
	}
	err = memAnswer(c, memOK, "", withLife, nil, gensFD, useFD)
	_ = unix.Close(gensFD)
	_ = unix.Close(useFD)
	return p, err
}

// shareBuffer opens the file of the buffer a map request names, checking
// the request against the buffer's guard entry as a handle check does,
// or says why not.
func (m *Manager) shareBuffer(req []byte) (fd int, status byte, size uint64, why string) {
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(req[off:]) }
	id, slot, gen := u64(0), binary.LittleEndian.Uint32(req[8:]), u64(12)
	key, base, hsize := u64(20), u64(28), u64(36)
	m.bufsMu.Lock()
	st := m.bufs[id]
	m.bufsMu.Unlock()
	if st == nil || st.ref() != nil {
		return -1, memStale, 0, "the buffer is closed"
	}
	defer st.Unref()
	g := m.guard
	switch {
	case !st.hasGrd || st.guard != slot || g.gen(slot) != gen:
		return -1, memStale, 0, "the handle is not the buffer's current one"
	case g.entryWord(slot, gwCMAKey) != key || g.entryWord(slot, gwBase) != base:
		return -1, memStale, 0, "key or address do not match the buffer"
	case hsize != st.size:
		return -1, memRange, st.size, "the handle's size is not the buffer's"
	case !st.shared:
		return -1, memRefused, 0, "the buffer is not shared: not a whole mr.Alloc allocation peers may read"
	}
	fd, ok, err := mr.File(st.mem, !st.access.Allows(mr.RemoteWrite))
	if err != nil || !ok {
		return -1, memRefused, 0, fmt.Sprintf("the buffer's file: %v", err)
	}
	return fd, memOK, st.size, ""
}

// memAnswer sends a reply, echoing the request's id, slot and gen (echo:
// nil for a control request); fds go along.
func memAnswer(c *net.UnixConn, status byte, why string, size uint64, echo []byte, fds ...int) error {
	b := make([]byte, 0, memReplyLen+len(why))
	b = append(b, memReply...)
	b = append(b, status)
	b = binary.LittleEndian.AppendUint64(b, size)
	if echo == nil {
		echo = make([]byte, 20)
	}
	b = append(b, echo...)
	b = append(b, why...)
	var oob []byte
	if len(fds) > 0 && fds[0] >= 0 {
		oob = unix.UnixRights(fds...)
	}
	_ = c.SetWriteDeadline(time.Now().Add(verifyTimeout))
	_, _, err := c.WriteMsgUnix(b, oob, nil)
	return err
}

// end drops a peer whose connection ended, unless its marks may still
// count: a live process that left a mark, or still maps its page, keeps
// it until it exits, or clears the mark and unmaps the page (prune).
func (ps *memPeers) end(p *memPeer) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i, q := range ps.list {
		if q == p {
			ps.list = append(ps.list[:i], ps.list[i+1:]...)
			break
		}
	}
	if p.droppable() {
		p.release()
		return
	}
	ps.ended = append(ps.ended, p)
}

// full reports whether the owner has handed out maxMemPeers use pages,
// after letting go of those whose marks no longer count. The ended peers
// kept (they still map their pages) count: each holds a page and a pidfd
// as a connected one does.
func (ps *memPeers) full() bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.prune()
	return len(ps.list)+len(ps.ended) >= maxMemPeers
}

// prune releases the ended peers whose marks no longer count. Under ps.mu.
func (ps *memPeers) prune() {
	kept := ps.ended[:0]
	for _, p := range ps.ended {
		if p.droppable() {
			p.release()
			continue
		}
		kept = append(kept, p)
	}
	clear(ps.ended[len(kept):])
	ps.ended = kept
}

// wait waits until no live peer marks an op on slot's buffer, or until
// deadline; it returns the processes still marked then.
func (ps *memPeers) wait(slot uint32, deadline time.Time) []int {
	ps.mu.Lock()
	ps.prune()
	list := append(append([]*memPeer(nil), ps.list...), ps.ended...)
	ps.waiting++
	ps.mu.Unlock()
	defer func() {
		ps.mu.Lock()
		if ps.waiting--; ps.waiting == 0 && ps.idle != nil {
			ps.idle.Broadcast()
		}
		ps.mu.Unlock()
	}()
	var busy []int
	for _, p := range list {
		for pause := time.Microsecond; p.busy(slot); pause = min(2*pause, time.Millisecond) {
			if time.Now().After(deadline) {
				busy = append(busy, p.pid)
				break
			}
			time.Sleep(pause) // an op is a copy: it ends within a piece's time
		}
	}
	return busy
}

// close lets the waits under way end, then releases every peer's page;
// the verifier is closed.
func (ps *memPeers) close() {
	ps.mu.Lock()
	if ps.idle == nil {
		ps.idle = sync.NewCond(&ps.mu)
	}
	for ps.waiting > 0 {
		ps.idle.Wait() // a Buffer.Close still waits for a peer's copy
	}
	list := append(ps.list, ps.ended...)
	ps.list, ps.ended = nil, nil
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
	pidfd int      // the owner's: whether it still lives; -1 without
	gens  []uint64 // the owner's generations, read-only
	life  *uint32  // the owner's lifeline, in the same mapping; nil when it has none
	page  []byte   // this manager's use page at the owner
	uses  mem.Uses
	maps  map[uint64]*memMap // by buffer id; under mu
	late  int                // answers still to come to questions given up on (ask); under mu
	done  atomic.Bool        // closed: the owner is gone, this manager closes, or the connection failed
	// users counts the ops between hold and drop, and has linkEndedBit
	// set once the link ended (end): the generations and use pages and
	// the pidfd above are theirs to read until the last of them drops a
	// link that ended (free). One word, so that the last drop and the end
	// agree on who frees.
	users    atomic.Int64
	gm       []byte // the generations mapping as mapped (gens and life are views of it)
	freeOnce sync.Once
	// entries: guard entries read from the owner (cma, shm), valid
	// while its generations say so.
	entries entryCache
}

// memMap is one buffer of the owner, mapped here, with what the owner
// confirmed of the handle it was mapped for. Its mapping goes when the
// link drops it and no op uses it.
type memMap struct {
	b              []byte
	gen, key, base uint64
	slot           uint32
	writable       bool
	refs           atomic.Int32 // the link's one, and one per op using it
}

func (mm *memMap) unref() {
	if mm.refs.Add(-1) == 0 {
		mem.Unmap(mm.b)
	}
}

// memLink returns the link to p: the one set up, or a new one when there
// is none and the last attempt may be made again (redialDue). The dial runs in
// a goroutine of its own (startDial), which the request waits for within
// t's limits: toward an owner that does not answer (stopped, say) a dial
// takes up to a few verifyTimeouts. Past the limits it returns an
// *awaitError; the dial goes on, for the next request. The route's end
// (the owner gone, or verified again) ends the wait with its own error.
func (p *sameNodePeer) memLink(t *reqTimes) (*memLink, error) {
	if l := p.up.Load(); l != nil && !l.done.Load() {
		return l, nil // without memMu: every same-node op comes here
	}
	for {
		p.memMu.Lock()
		if p.memEnd == nil {
			p.memEnd = make(chan struct{}) // closed by closeMem
		}
		ended := p.memEnd
		// replaced and gone are set before closeMem runs (watch): no dial
		// for a verification that is over.
		switch {
		case p.replaced.Load() && !p.gone.Load():
			// This manager verified the owner again (reverify, evict): the
			// new verification has the link (route takes it).
			p.memMu.Unlock()
			return nil, &memLinkEnded{pid: p.pid}
		case p.memDone || p.gone.Load():
			p.memMu.Unlock()
			return nil, peerGone(p.pid)
		case p.link != nil && !p.link.done.Load():
			l := p.link
			p.memMu.Unlock()
			return l, nil
		case !p.dialing && p.linkErr != nil && !p.redialDue():
			if !p.linkTimedOut {
				err := p.linkErr
				p.memMu.Unlock()
				return nil, err
			}
			// The owner took no connection or did not answer in time: it
			// may be stopped or busy for a moment. The request waits
			// within its limits for the next dial, as for a verification
			// that timed out (verifyAgain), and ends as its own timeout.
			retry := time.Until(p.linkRetry)
			p.linkWaits++
			p.memMu.Unlock()
			due := make(chan struct{})
			tm := time.AfterFunc(retry, func() { close(due) })
			err := t.waitFor(due, ended)
			tm.Stop()
			if err != nil {
				return nil, &awaitError{what: "the owner's answer on the mem link", provider: mem.Name, pid: p.pid, cause: err}
			}
			continue
		}
		if !p.dialing {
			p.startDial()
		}
		dialed := p.dialed
		p.memMu.Unlock()
		if err := t.waitFor(dialed, ended); err != nil {
			return nil, &awaitError{what: "the owner's answer on the mem link", provider: mem.Name, pid: p.pid, cause: err}
		}
	}
}

// startDial starts setting up the link to p in a goroutine of its own,
// which closes p.dialed when it is done. Under p.memMu, with no dial under
// way.
func (p *sameNodePeer) startDial() {
	dialed := make(chan struct{})
	p.dialing, p.dialed = true, dialed
	p.linkDials++
	began := time.Now()
	go func() {
		l, err := dialMem(p)
		p.memMu.Lock()
		old := p.link
		if p.memDone {
			// closeMem ran meanwhile: the link would outlive the route.
			old = nil
			if l != nil {
				l.close()
				l, err = nil, errors.New("the mem route was closed")
			}
		}
		var ne net.Error
		p.link, p.linkErr, p.linkAt = l, err, time.Now()
		p.linkTimedOut = errors.As(err, &ne) && ne.Timeout()
		p.linkRetry = began.Add(verifyTimeout)
		p.up.Store(l)
		p.dialing = false
		p.memMu.Unlock()
		if old != nil {
			// Done already; its mappings go with it now (ops using one
			// keep it until they end), as closeMem's. Before the waiters
			// hear of the new link, so that none finds the old one's
			// mappings still there; outside memMu, which old.close's
			// l.mu must not wait under.
			old.close()
		}
		close(dialed)
	}()
}

// redialDue reports whether a failed link may be dialed again: one that
// timed out verifyTimeout after its last dial began (an owner whose queue
// of connections is full refuses at once, and must not be dialed in a
// loop), another memRedial after it failed. Under memMu.
func (p *sameNodePeer) redialDue() bool {
	if p.linkTimedOut {
		return !time.Now().Before(p.linkRetry)
	}
	return time.Since(p.linkAt) >= memRedial
}

// dialMem opens the mem connection to p, checks that the kernel says it
// is p's process, and asks for the generations page and a use page.
func dialMem(p *sameNodePeer) (*memLink, error) {
	d := net.Dialer{Timeout: verifyTimeout}
	nc, err := d.Dial("unixpacket", verifySocket(p.owner))
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		// Its manager listens and takes no connection (its backlog is
		// full: stopped, say): a timeout, dialed again (memLink).
		return nil, fmt.Errorf("link to process %d: its manager takes no connection: %w", p.pid, err)
	case err != nil:
		return nil, fmt.Errorf("%w (%v)", errNoAnswer, errors.Unwrap(err))
	}
	c := nc.(*net.UnixConn)
	// closeMem ends the dial too: a route that ended must not leave it
	// waiting for the owner's answer up to verifyTimeout.
	p.memMu.Lock()
	if p.memDone {
		p.memMu.Unlock()
		_ = c.Close()
		return nil, fmt.Errorf("link to process %d: the mem route was closed", p.pid)
	}
	p.dialConn = c
	p.memMu.Unlock()
	defer func() {
		p.memMu.Lock()
		p.dialConn = nil
		p.memMu.Unlock()
	}()
	fail := func(format string, a ...any) (*memLink, error) {
		_ = c.Close()
		return nil, fmt.Errorf("link to process %d: "+format, append([]any{p.pid}, a...)...)
	}
	cred, err := peerCred(c)
	if err != nil || int(cred.Pid) != p.pid || cred.Uid != uint32(os.Geteuid()) {
		return fail("the verifier socket is not its process's any more")
	}
	_ = c.SetReadDeadline(time.Now().Add(verifyTimeout))
	b := make([]byte, proofMaxSize+1)
	n, err := c.Read(b)
	if err != nil {
		return fail("no answer: %w", err) // %w: a timeout is dialed again (memLink)
	}
	var again sameNodePeer
	if pid, err := parseProof(b[:n], &again); err != nil || pid != p.pid || again.cma != p.cma {
		return fail("it answers as another manager")
	}
	l := &memLink{owner: p, conn: c, pidfd: -1, maps: map[uint64]*memMap{}}
	withLife, fds, err := l.ask(nil, []byte(memCtlReq), nil, 2)
	if err != nil {
		return fail("%w", err)
	}
	gensLen := useSlots * 8
	if withLife == lifeOffset+lifeline.Size { // any other value: an owner without one
		gensLen = int(withLife)
	}
	gm, _, err := mem.Map(fds[0], gensLen, false)
	if err != nil {
		_ = unix.Close(fds[1])
		return fail("its generations: %v", err)
	}
	pm, writable, err := mem.Map(fds[1], useSlots*4, true)
	if err != nil || !writable {
		mem.Unmap(gm)
		mem.Unmap(pm)
		return fail("its use page: %v", err)
	}
	if fd, err := unix.PidfdOpen(p.pid, 0); err == nil {
		l.pidfd = fd
	}
	l.gm, l.gens, l.page, l.uses = gm, mr.Words64(gm[:useSlots*8]), pm, mem.UsesOf(pm)
	if gensLen > useSlots*8 {
		l.life, _ = mr.Word32(gm, lifeOffset) // lifeOffset is 8-aligned: the word itself
	}
	return l, nil
}

// memAnswerError is an owner's refusal, with the error class it maps to.
type memAnswerError struct {
	status byte
	why    string
}

func (e *memAnswerError) Error() string { return "the owner refuses: " + e.why }

// ask sends a request and reads the answer, which must echo the request's
// id, slot and gen (echo; nil for a control request), with the files it
// carries (want of them on success). It waits up to verifyTimeout, and
// no longer than t's limits when t is not nil (a request's). A request
// that gives up at its limits leaves its answer to come (late): the next
// ask skips it, so that one short deadline does not end the link every
// op shares. Any other failure but a refusal leaves the connection out of
// step, so it ends the link: the next op dials again. Under l.mu, or
// before l is shared.
func (l *memLink) ask(t *reqTimes, req, echo []byte, want int) (size uint64, fds []int, err error) {
	if t != nil {
		if err := t.err(); err != nil {
			return 0, nil, err // nothing asked: the link stays as it is
		}
	}
	sent, unsent := false, false
	defer func() {
		var refused *memAnswerError
		var ne net.Error
		switch {
		case err == nil, errors.As(err, &refused):
		case unsent:
			// The request's end came before the question went out (a
			// seqpacket write sends all or nothing): nothing is owed.
		case sent && t != nil && t.err() != nil && errors.As(err, &ne) && ne.Timeout():
			l.late++
		default:
			l.end()
			_ = l.conn.Close()
		}
	}()
	deadline := time.Now().Add(verifyTimeout)
	if t != nil {
		if _, d := t.get(); d.Before(deadline) {
			deadline = d
		}
	}
	_ = l.conn.SetDeadline(deadline)
	if t != nil && t.ctx.Done() != nil {
		// A cancel ends the wait as the deadline would; only while this
		// ask runs: the next one sets a deadline of its own.
		var mu sync.Mutex
		active := true
		stop := context.AfterFunc(t.ctx, func() {
			mu.Lock()
			defer mu.Unlock()
			if active {
				_ = l.conn.SetDeadline(time.Unix(1, 0))
			}
		})
		defer func() {
			stop()
			mu.Lock()
			active = false
			mu.Unlock()
		}()
	}
	if n, err := l.conn.Write(req); err != nil {
		var ne net.Error
		unsent = n == 0 && t != nil && t.err() != nil && errors.As(err, &ne) && ne.Timeout()
		return 0, nil, err
	}
	sent = true
	b := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4*4))
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if echo == nil {
		echo = make([]byte, 20)
	}
	var n int
	for {
		var oobn, flags int
		n, oobn, flags, _, err = l.conn.ReadMsgUnix(b, oob)
		if err != nil {
			return 0, nil, err
		}
		fds = nil
		if cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
			for _, cm := range cmsgs {
				if got, err := unix.ParseUnixRights(&cm); err == nil {
					fds = append(fds, got...)
				}
			}
		}
		if flags&unix.MSG_CTRUNC != 0 || n < memReplyLen || string(b[:4]) != memReply {
			closeAll()
			return 0, nil, errors.New("a malformed answer")
		}
		if l.late == 0 {
			break
		}
		// The answer to a question given up on, whatever it echoes (two
		// questions may echo alike): the owner answers each, in order.
		closeAll()
		l.late--
	}
	if string(b[13:33]) != string(echo) {
		closeAll()
		return 0, nil, errors.New("an answer to another request")
	}
	switch {
	case b[4] != memOK:
		closeAll()
		return binary.LittleEndian.Uint64(b[5:]), nil, &memAnswerError{status: b[4], why: string(b[memReplyLen:n])}
	case len(fds) != want:
		closeAll()
		return 0, nil, fmt.Errorf("an answer with %d files, not %d", len(fds), want)
	}
	return binary.LittleEndian.Uint64(b[5:]), fds, nil
}

// gen is slot's generation now.
func (l *memLink) gen(slot uint32) uint64 { return atomic.LoadUint64(l.genWord(slot)) }

// genWord is slot's generation word in the owner's page.
func (l *memLink) genWord(slot uint32) *uint64 { return &l.gens[slot] }

// alive reports whether the owner process still runs: its lifeline says
// so (one load), or else its pidfd is not readable (a system call: an
// owner without a lifeline, or whose manager closed). Without a pidfd,
// the end of the owner's verified connection says it, or, once this
// manager ended that connection itself (replaced), /proc.
func (l *memLink) alive() bool {
	if l.life != nil && lifeline.Alive(l.life) {
		return true
	}
	if l.pidfd < 0 {
		if l.owner.gone.Load() {
			return false
		}
		if l.owner.replaced.Load() {
			gone, _ := proc.Gone(l.owner.pid)
			return !gone
		}
		return true
	}
	return !proc.PidfdExited(l.pidfd)
}

// endedErr is the error of an op that found l ended: ErrPeerGone when the
// owner's side ended its verified connection or the OS says it exited;
// otherwise this manager ended the link (a failed request, or it
// verified the owner again) while the owner lives, and nothing moved.
func (l *memLink) endedErr() error {
	return l.endedAs(l.owner.gone.Load() || !l.alive())
}

// endedErrUnheld is endedErr for an op that found l done before it held
// it: its pidfd and lifeline may be gone, so /proc says whether the owner
// exited (or the owner's side ended the verified connection: gone).
func (l *memLink) endedErrUnheld() error {
	exited, _ := proc.Gone(l.owner.pid)
	return l.endedAs(exited || l.owner.gone.Load())
}

// endedAs is the error of an op that found l ended: ErrPeerGone when the
// owner is gone, else nothing moved (memLinkEnded).
func (l *memLink) endedAs(gone bool) error {
	if gone {
		e := peerGone(l.owner.pid)
		e.Provider = mem.Name
		return e
	}
	return &memLinkEnded{pid: l.owner.pid}
}

// get returns the mapping of the handle's buffer, holding it for one op:
// from the ones mapped (when the owner confirmed this handle's key,
// address and size for it), or asked for now, within t's limits (past
// them, an *awaitError).
func (l *memLink) get(t *reqTimes, r *RemoteBuffer, ep *remoteEP) (*memMap, error) {
	g := ep.guard
	if !l.mu.TryLock() {
		// Another op asks the owner: its answer takes a round trip, or
		// as long as an owner that does not answer takes to fail it.
		if err := lockWithin(&l.mu, t); err != nil {
			return nil, l.awaitingMap(r, err)
		}
	}
	defer l.mu.Unlock()
	if l.done.Load() {
		return nil, l.endedErr()
	}
	if mm := l.maps[r.id]; mm != nil && mm.gen == g.gen && mm.slot == g.slot {
		switch {
		case mm.key != ep.key || mm.base != ep.base:
			return nil, fmt.Errorf("%w: key or address of buffer %d do not match what its owner registered", ErrStaleHandle, r.id)
		case uint64(len(mm.b)) != r.size && r.off+r.n > uint64(len(mm.b)):
			return nil, fmt.Errorf("%w: the handle's range [%d, %d) lies outside the %d bytes its owner registered as buffer %d (the handle was altered)",
				ErrOutOfRange, r.off, r.off+r.n, len(mm.b), r.id)
		case uint64(len(mm.b)) != r.size:
			return nil, fmt.Errorf("%w: size of buffer %d does not match what its owner registered", ErrStaleHandle, r.id)
		}
		mm.refs.Add(1)
		return mm, nil
	}
	l.sweep()
	req := make([]byte, 0, memMapLen)
	req = append(req, memMapReq...)
	req = binary.LittleEndian.AppendUint64(req, r.id)
	req = binary.LittleEndian.AppendUint32(req, g.slot)
	req = binary.LittleEndian.AppendUint64(req, g.gen)
	req = binary.LittleEndian.AppendUint64(req, ep.key)
	req = binary.LittleEndian.AppendUint64(req, ep.base)
	req = binary.LittleEndian.AppendUint64(req, r.size)
	size, fds, err := l.ask(t, req, req[4:24], 1)
	var refused *memAnswerError
	switch {
	case err != nil && t.err() != nil:
		// The request's limits ended the wait (and the link: ask).
		return nil, l.awaitingMap(r, t.err())
	case errors.As(err, &refused) && refused.status == memRange && r.off+r.n > size:
		return nil, fmt.Errorf("%w: the handle's range [%d, %d) lies outside the %d bytes its owner registered as buffer %d (the handle was altered)",
			ErrOutOfRange, r.off, r.off+r.n, size, r.id)
	case errors.As(err, &refused):
		// The owner shares what its handles say it shares: a refusal
		// is a handle that is no longer its buffer's, or was altered.
		return nil, fmt.Errorf("%w: buffer %d: %v", ErrStaleHandle, r.id, err)
	case err != nil:
		// ask ended the link: the kernel says whether the owner lives
		// (nothing moved, retryable) or is gone.
		return nil, fmt.Errorf("mem route to process %d: %v: %w", l.owner.pid, err, l.endedErr())
	case size != r.size:
		_ = unix.Close(fds[0])
		return nil, fmt.Errorf("%w: the owner's buffer %d holds %d bytes, the handle says %d", ErrStaleHandle, r.id, size, r.size)
	}
	b, writable, err := mem.Map(fds[0], int(size), true)
	if err != nil {
		return nil, fmt.Errorf("mem route to process %d: %w", l.owner.pid, err)
	}
	mm := &memMap{b: b, gen: g.gen, key: ep.key, base: ep.base, slot: g.slot, writable: writable}
	mm.refs.Store(2) // the link's and the op's
	if old := l.maps[r.id]; old != nil {
		old.unref()
	}
	l.maps[r.id] = mm
	return mm, nil
}

// awaitingMap is the *awaitError of a request whose limits ended (err)
// while it waited for the owner's answer for r's buffer.
func (l *memLink) awaitingMap(r *RemoteBuffer, err error) *awaitError {
	return &awaitError{what: fmt.Sprintf("the owner's answer for buffer %d", r.id), provider: mem.Name, pid: l.owner.pid, cause: err}
}

// sweep drops the mappings of buffers the owner closed since (a mapping
// keeps the owner's freed pages alive), and, when maxMemMaps are mapped
// still, others at random. Under l.mu.
func (l *memLink) sweep() {
	for id, mm := range l.maps {
		if l.gen(mm.slot) != mm.gen {
			delete(l.maps, id)
			mm.unref()
		}
	}
	for id, mm := range l.maps {
		if len(l.maps) < maxMemMaps {
			break
		}
		delete(l.maps, id)
		mm.unref()
	}
}

// close drops every mapping (ops using one keep it until they end) and
// the connection. The generations and use pages and the pidfd go when no
// op holds the link any more (free).
func (l *memLink) close() {
	l.mu.Lock()
	unused := l.mark()
	for id, mm := range l.maps {
		delete(l.maps, id)
		mm.unref()
	}
	_ = l.conn.Close()
	l.mu.Unlock()
	if unused {
		l.free()
	}
}

// linkEndedBit is set in memLink.users once the link ended.
const linkEndedBit = 1 << 62

// mark ends the link for hold: done, and linkEndedBit set. It reports
// whether the link had no user and had not ended before: its caller
// frees it then, the last user's drop otherwise.
func (l *memLink) mark() bool {
	l.done.Store(true)
	return l.users.Or(linkEndedBit) == 0
}

// end ends the link (mark), and frees it when nobody holds it.
func (l *memLink) end() {
	if l.mark() {
		l.free()
	}
}

// hold counts an op as a user of the link's pages and pidfd, unless the
// link ended: it then reports false, and the op must not touch them
// (they may be gone). Every hold that reports true is ended by a drop.
func (l *memLink) hold() bool {
	for {
		n := l.users.Load()
		if n&linkEndedBit != 0 {
			return false
		}
		if l.users.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// drop ends a hold; the last user of a link that ended frees it.
func (l *memLink) drop() {
	if l.users.Add(-1) == linkEndedBit {
		l.free()
	}
}

// free unmaps the generations and use pages and closes the pidfd, once:
// a long-lived process reaches any number of owners over its life. (The
// buffers' mappings go in close; a link a failed request ended keeps
// them until the next op replaces it or the owner's connection ends.)
func (l *memLink) free() {
	l.freeOnce.Do(func() {
		mem.Unmap(l.gm)
		mem.Unmap(l.page)
		if l.pidfd >= 0 {
			_ = unix.Close(l.pidfd)
		}
	})
}

// prepareMem checks a mem op against the owner's generation of the
// buffer and takes the buffer's mapping for it over l, the link route
// found to the owner (the owner checked the handle's key, address and
// size when it shared the file).
func (m *Manager) prepareMem(t *reqTimes, o *opSpec, l *memLink) error {
	if !l.hold() {
		return fmt.Errorf("%s: %w", o.op, l.endedErrUnheld())
	}
	g := o.ep.guard // matchesPeer bounded its slot
	if l.gen(g.slot) != g.gen {
		l.drop()
		return fmt.Errorf("%w: the owner no longer has buffer %d (closed, or the handle is from an earlier registration)", ErrStaleHandle, o.remote.id)
	}
	mm, err := l.get(t, &o.remote, o.ep)
	if err != nil {
		l.drop()
		return fmt.Errorf("%s: %w", o.op, err)
	}
	if o.op == progress.Write && !mm.writable {
		mm.unref()
		l.drop()
		return fmt.Errorf("%s: %w: the owner shared buffer %d read-only", o.op, ErrAccessDenied, o.remote.id)
	}
	o.link, o.mm = l, mm // o holds l until releaseOps
	return nil
}

// runMem runs the request's mem ops and appends their errors to errs; it
// returns errs and how many ops failed. An op toward an owner that is
// found dead once the request's copies are done fails: a copy with its
// memory after it died went nowhere (the pages outlive it).
func (m *Manager) runMem(lim route.Limit, ops []opSpec, errs []error) ([]error, int) {
	failed := 0
	var last *memLink
	lastAlive := false
	for i := range ops {
		if o := &ops[i]; o.kind == route.Mem && o.mm != nil {
			if o.op == progress.Read {
				// A read from an owner already gone fails before it
				// copies, leaving the local buffer as it was: its pages
				// outlive it in the mapping.
				if o.link != last {
					last, lastAlive = o.link, o.link.alive()
				}
				if !lastAlive && !m.down.Load() {
					o.memErr = m.memGone(o.op, o.peer)
				}
			}
			if o.memErr == nil {
				o.memErr = m.memCopy(lim, o.op, o.local.st.mem[o.local.off:o.local.off+o.remote.n],
					o.mm.b[o.remote.off:o.remote.off+o.remote.n], o.link, o.ep.guard, o.peer, o.remote.id)
			}
			o.mm.unref()
			o.mm = nil
			o.copied = true
		}
	}
	last, lastAlive = nil, false
	for i := range ops {
		o := &ops[i]
		if !o.copied {
			continue
		}
		o.copied = false
		err := o.memErr
		o.memErr = nil
		if linkEnded(err) {
			err = m.redoMem(lim, o, err)
		}
		if err == nil {
			if o.link != last {
				last, lastAlive = o.link, o.link.alive()
			}
			if !lastAlive && !m.down.Load() {
				err = m.memGone(o.op, o.peer)
			}
		}
		if err != nil {
			errs = append(errs, err)
			failed++
		}
	}
	return errs, failed
}

// memRedos is how many times one request routes a mem op again after
// its link ended with the owner alive (memLinkEnded, nothing moved): this
// manager verifying the owner again (reverify, evict), or the owner
// replacing its shm endpoint, is no failure of the caller's request.
const memRedos = 2

// takeMem takes o's link and mapping on rt, a mem route (prepareMem), and
// remembers the route in the handle when it is settled. When the link
// ended meanwhile with the owner alive, it routes the handle again
// (rerouteMem) for the new verification's link.
func (m *Manager) takeMem(t *reqTimes, o *opSpec, rt routed) error {
	for {
		err := m.prepareMem(t, o, rt.link)
		if err == nil {
			if rt.settled {
				keepMemo(m, o)
			}
			return nil
		}
		if rt, err = m.rerouteMem(t, o, err, t.ctx.Err() != nil || pastDeadline(t.ctx)); err != nil {
			return err
		}
	}
}

// rerouteMem routes o's handle again after err, when err says its link
// ended with the owner alive (memLinkEnded), and returns the new mem
// route. It returns the op's error instead when err is another, when the
// op was routed again memRedos times already, when its request's context
// or deadline ended (ended), or when the handle no longer routes over mem
// (the next request takes the other route). Under the manager's hold.
func (m *Manager) rerouteMem(t *reqTimes, o *opSpec, err error, ended bool) (routed, error) {
	if !linkEnded(err) || o.redos == memRedos || ended {
		return routed{}, err
	}
	o.redos++
	rt, rerr := m.route(&o.remote, o.pin, t)
	if rt.gone != nil {
		rt.gone.Op = o.op
	}
	switch {
	case rerr != nil:
		return rt, fmt.Errorf("%s: %w", o.op, rerr)
	case rt.kind != route.Mem:
		return rt, err
	}
	o.peer, o.ep = rt.peer, rt.ep
	return rt, nil
}

// redoMem is takeMem for an op whose copy found its link ended (err): it
// routes o again and copies over the new link. It returns the op's error.
// It runs after the request let go of the manager, and holds it again
// while it routes: a manager that closed verifies nobody again.
func (m *Manager) redoMem(lim route.Limit, o *opSpec, err error) error {
	for linkEnded(err) {
		if m.acquire() != nil {
			return fmt.Errorf("%s over %s: %w", o.op, mem.Name, ErrClosed)
		}
		o.link.drop() // prepareMem's hold
		o.link = nil
		t := reqTimes{ctx: lim.Ctx, timeout: m.cfg.timeout, quit: m.quit, start: lim.Start, deadline: lim.Deadline}
		rt, rerr := m.rerouteMem(&t, o, err, limitEnded(lim))
		if rerr == nil {
			rerr = m.takeMem(&t, o, rt)
		}
		m.releaseManager()
		if to := awaited(rerr, o, &t); to != nil {
			return to
		}
		if rerr != nil {
			return rerr
		}
		mm := o.mm
		o.mm = nil // memOne lets go of it
		err = m.memOne(lim, o.op, o.local.st.mem[o.local.off:o.local.off+o.remote.n],
			mm.b[o.remote.off:o.remote.off+o.remote.n], o.link, mm, o.ep.guard, o.peer, o.remote.id)
	}
	return err
}

// limitEnded reports whether the request's context or deadline ended. A
// request of copies has no deadline of its own (lim.Deadline is zero, see
// copiesOnly): its context's counts then.
func limitEnded(lim route.Limit) bool {
	if lim.Deadline.IsZero() {
		return lim.Ctx.Err() != nil || pastDeadline(lim.Ctx)
	}
	return lim.Err() != nil
}

// memOne is runMem for a request of one op, copying local to or from
// remote, its range of the owner's buffer mapped (held for the op).
func (m *Manager) memOne(lim route.Limit, op progress.Op, local, remote []byte, l *memLink, mm *memMap, g *guardRef, peer *sameNodePeer, id uint64) error {
	var err error
	if op == progress.Read && !l.alive() && !m.down.Load() {
		err = m.memGone(op, peer) // as runMem: nothing copied from an owner already gone
	}
	if err == nil {
		err = m.memCopy(lim, op, local, remote, l, g, peer, id)
	}
	mm.unref()
	if err == nil && !l.alive() && !m.down.Load() {
		err = m.memGone(op, peer)
	}
	return err
}

// memGone is the error of a mem op whose owner died.
func (m *Manager) memGone(op progress.Op, peer *sameNodePeer) error {
	e := peerGone(peer.pid)
	e.Op, e.Provider = op, mem.Name
	return e
}

// linkEndedErr is the error of an op over route (mem, cma, shm) that
// found its link l to peer ended before it was marked: nothing moved.
func (m *Manager) linkEndedErr(op progress.Op, route string, peer *sameNodePeer, l *memLink) error {
	gone := peer.gone.Load()
	switch {
	case gone:
	case l != nil:
		gone = !l.alive()
	default:
		gone, _ = proc.Gone(peer.pid)
	}
	switch {
	case m.down.Load():
		return fmt.Errorf("%s over %s: %w", op, route, ErrClosed)
	case gone:
		e := peerGone(peer.pid)
		e.Op, e.Provider = op, route
		return e
	}
	// Another op's request on the link failed, or this manager verified
	// the owner again: the owner lives, and the next op dials again.
	return fmt.Errorf("%s over %s: %w", op, route, &memLinkEnded{pid: peer.pid})
}

// memLinkEnded is a mem op that found its link ended between its checks
// and its mark while the owner lived — by another op's failed request,
// or because this manager verified the owner again (reverify, evict):
// nothing moved, and the next op dials again. Retryable says so.
type memLinkEnded struct{ pid int }

func (e *memLinkEnded) Error() string {
	return fmt.Sprintf("the link to process %d ended before the copy began (nothing moved); a new op dials again", e.pid)
}

// memCopy is one mem op on buffer id of peer over l: marked in the use
// page while it copies, and only while the owner has the buffer open
// (g's generation) and lives.
func (m *Manager) memCopy(lim route.Limit, op progress.Op, local, remote []byte, l *memLink, g *guardRef, peer *sameNodePeer, id uint64) error {
	l.uses.Mark(g.slot)
	defer l.uses.Leave(g.slot)
	if l.done.Load() {
		// The link may have ended before the mark, and the owner then no
		// longer counts this page: its Close would not wait for the copy.
		// A link is done before its connection closes, so a mark made
		// while it was not is seen.
		return m.linkEndedErr(op, mem.Name, peer, l)
	}
	owner := mem.Owner{PID: peer.pid, Gen: l.genWord(g.slot), Want: g.gen, Gone: &peer.gone}
	err := owner.Open()
	if err == nil {
		err = mem.Copy(lim, op, local, remote, &owner)
	}
	switch {
	case err == nil:
	case errors.Is(err, mem.ErrGone) && m.down.Load():
		return fmt.Errorf("%s over %s: %w", op, mem.Name, ErrClosed) // this manager ended its links
	case errors.Is(err, mem.ErrGone):
		return m.memGone(op, peer)
	case errors.Is(err, mem.ErrClosed):
		return fmt.Errorf("%s: %w: buffer %d was closed by its owner", op, ErrStaleHandle, id)
	}
	return err
}
