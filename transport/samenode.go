package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/progress"
)

// Same-node peer verification.
//
// The same-node routes (cma, shm) act on another process's memory, so the
// process they act on must be proven by the OS, never named by a handle:
// a handle is whatever its sender wrote, and a hostile one could name any
// pid and any address — this process's own, say. Each manager that owns
// buffers listens on an abstract Unix socket named after its manager ID.
// An initiator that wants a same-node route to a handle's owner connects
// to it and takes the owner's pid and uid from the kernel (SO_PEERCRED),
// not from the owner's word. It uses a same-node route only toward a
// process of its own uid that is not itself, and takes from that
// connection — not from the handle — the owner's guard table location and
// shm endpoint name. The connection stays open: when the owner closes its
// manager or dies, it ends, and the peer is no longer verified. An owner
// that replaced its shm endpoint writes announceReverify on it before it
// ends it: the peer verifies it again, and does not take it for gone.
//
// Before its first shm op toward the owner, the peer opens a second
// connection and writes announceShm on it, and keeps it open as long as
// the first: shm's completion queue has no wait object that a peer's
// command wakes, so the owner's shm loop parks while no peer has
// announced itself, and polls while one has (libfabric 1.x's shm needs
// the owner's progress for a new peer's first op and, where it cannot
// copy with CMA, for every op; 2.x's, whose single-copy path fitransfer
// turns off, for every op). While a peer attends, an idle owner's loop
// polls its endpoint every MaxSleep at most; so that a peer's op after
// an idle spell does not wait for the next look, the peer writes
// announceWake on the same connection as the op goes out (wakeOwner),
// and the owner's loop looks at once, and for its Spin. A peer that uses
// cma announces nothing: cma needs no progress of the owner. A second connection, not a byte on
// the first, because an owner of an earlier version takes any byte on the
// first for its end (and answers the second with a proof it is free to
// ignore). For firstOpGrace after any peer connects the owner's shm loop
// polls anyway: for a first op that overtakes the announcement, and for
// peers of earlier versions, which announce nothing (their later ops,
// where they need the owner, wait for its parked loop's next look).

const (
	proofMagic   = "FTV1"
	proofHeader  = 4 + 4 + 4*8 + 2
	proofMaxSize = proofHeader + maxEPNameLen
	// verifyTimeout bounds the handshake with a peer's manager.
	verifyTimeout = 2 * time.Second
	// announceShm is what a peer writes on its second connection to an
	// owner's verifier: it is about to use shm toward it.
	announceShm = 'S'
	// announceWake is what it writes there when an shm op begins after
	// an idle spell (wakeOwner).
	announceWake = 'W'
	// announceOut, followed by an shm endpoint name, is what a peer
	// writes on its announcing connection when its shm ops toward the
	// owner go out on an Outgoing endpoint (libfabric 2.x): the owner
	// frees what that endpoint's handshake took once it closed
	// (releaseIncoming). An owner of an earlier version refuses it; the
	// peer then sends it no more (wakeOwner reads the refusal).
	announceOut = 'N'
	// announceClean is what a peer writes there as its manager closes
	// with no op in flight on its Outgoing endpoints: the owner may free
	// what their handshakes took once they closed (releaseIncoming). A
	// peer killed, or closing with ops in flight, sends none: a transfer
	// of its may still be under way at the owner, which shm answers
	// through the peer's slot.
	announceClean = 'C'
	// announceDone, followed by the name of an Outgoing endpoint named
	// before, is what a peer writes there once that endpoint closed
	// drained (closeRetired): nothing of it is under way at the owner.
	announceDone = 'D'
	// announceReverify is what an owner writes on its peers' connections
	// just before it ends them to be verified again (dropPeers, when it
	// replaced its shm endpoint): it lives, and ops in flight toward it
	// fail as nothing moved, not as gone. The kernel still decides
	// whether it lives (memLink.alive, and the next verification).
	announceReverify = 'R'
)

// firstOpGrace is how long an owner's shm loop polls for any peer that
// connects to its verifier, announced or not (a variable for tests).
var firstOpGrace = time.Second

// sameNodePeer is an owner process verified by the kernel: the socket's
// peer credentials name pid and this process's uid.
type sameNodePeer struct {
	pid     int
	cma     guardLoc // its guard table for process_vm_readv: address and table id
	shm     guardLoc // the same table over shm: remote address and memory key
	shmName []byte   // its shm endpoint name; nil without shm
	// shmFormat: whether this process's shm and the owner's speak one
	// format (shmMismatch): 0 not looked at yet, 1 they do, 2 they do
	// not, shmWhy saying so.
	shmFormat atomic.Int32
	shmMu     sync.Mutex
	shmWhy    string
	conn      *net.UnixConn
	// gone: the owner's side ended the connection: it closed its manager
	// or exited. Never set when this manager ended it (replaced).
	gone atomic.Bool
	// replaced: this manager dropped the connection to verify again (or
	// to forget the owner); the owner is not gone, so what shm holds for
	// it stays, and gone stays unset: an op that meets its ended link
	// asks the OS whether the owner died (memLink.alive).
	replaced atomic.Bool

	// The mem route to it: link, or why not since linkAt (a failed
	// link is dialed again after memRedial, one that timed out
	// verifyTimeout after its dial began; a closed one never).
	memMu sync.Mutex
	link  *memLink
	// up is link, for readers that must not wait for memMu
	// (linkForChecks): written with it, under memMu.
	up      atomic.Pointer[memLink]
	linkErr error
	linkAt  time.Time
	// linkTimedOut: linkErr is a timeout (the owner took no connection,
	// or did not answer within verifyTimeout), dialed again from
	// linkRetry on; linkDials counts the dials, linkWaits the requests'
	// waits for linkRetry (tests).
	linkTimedOut bool
	linkRetry    time.Time
	linkDials    int
	linkWaits    int
	memDone      bool
	memEnd       chan struct{} // closed as memDone is set (closeMem); made by memLink, under memMu
	dialConn     *net.UnixConn // the connection of the dial under way, for closeMem to end; under memMu
	dialing      bool          // a link is being set up (startDial)
	dialed       chan struct{} // closed when that is done
	owner        ID
	announce     sync.Once
	annMu        sync.Mutex
	annConn      *net.UnixConn // the connection announcing shm use; nil when none
	ended        bool          // conn ended: no announcement may outlive it; under annMu
	noWake       bool          // the owner answered a wake: it does not know it; under annMu
	// proofRead: the owner's proof, its first message on the announcing
	// connection, was read (wakeOwner); under annMu.
	proofRead bool
	// shmAt: when this manager's last shm op toward the owner began
	// (since clockStart), for wakeOwner.
	shmAt atomic.Int64
	// told is 1 + the index of the last Outgoing endpoint named to the
	// owner (tellOut): they only move on to higher ones.
	told atomic.Int64
	// outSent counts the names sent, outRefused the refusals of an
	// owner of an earlier version, which gets no more once it refused
	// one; under annMu.
	outSent, outRefused int
}

// usesShm tells the owner, once, that this manager is about to use shm
// toward it, so that the owner's shm loop polls for it (see above). The
// announcement needs no answer: the owner's kernel queues the connection
// and the byte, and its verifier wakes on them. A failure is left to the
// shm ops, which fail or wait for the owner by themselves.
func (p *sameNodePeer) usesShm() {
	p.announce.Do(func() {
		d := net.Dialer{Timeout: verifyTimeout}
		nc, err := d.Dial("unixpacket", verifySocket(p.owner))
		if err != nil {
			return
		}
		c := nc.(*net.UnixConn)
		cred, err := peerCred(c)
		if err != nil || int(cred.Pid) != p.pid {
			_ = c.Close() // not the verified process: it learns nothing
			return
		}
		if _, err := c.Write([]byte{announceShm}); err != nil {
			_ = c.Close()
			return
		}
		p.annMu.Lock()
		defer p.annMu.Unlock()
		if p.ended {
			_ = c.Close()
			return
		}
		p.annConn = c
	})
}

// tellOut names b, the Outgoing shm endpoint an op toward p goes out on,
// to the owner once (announceOut): the owner then frees the slot and the
// mapping that b's handshake takes in its map once b closed. Sent
// without blocking on the announcing connection; a name the owner does
// not get leaves that slot to its endpoint's life, as before. An owner
// that refused one (of an earlier version) gets no more.
func (p *sameNodePeer) tellOut(b *libfabric.Route) {
	if !b.Outgoing || int64(b.Index) < p.told.Load() {
		return
	}
	p.annMu.Lock()
	defer p.annMu.Unlock()
	if int64(b.Index) < p.told.Load() {
		return
	}
	p.told.Store(int64(b.Index) + 1) // sent or not: a name lost costs a slot, not a try per op
	if p.annConn == nil || p.outRefused > 0 {
		return
	}
	rc, err := p.annConn.SyscallConn()
	if err != nil {
		return
	}
	msg := append([]byte{announceOut}, b.EndpointName()...)
	_ = rc.Control(func(fd uintptr) {
		if unix.Send(int(fd), msg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL) == nil {
			p.outSent++
		}
	})
}

// wakeOwner, as an shm op toward p goes out, tells the owner that the op
// is on its way when this manager's previous one toward it began over
// wakeAfter ago: by then the owner's shm loop may have stopped looking
// after its last activity, and sleep up to its MaxSleep between looks
// (shm's CQ has no wait object a peer's command wakes), while on
// libfabric 2.x every op, and on 1.x those CMA does not serve, waits for
// the owner's progress. The owner's verifier wakes its loop
// (announceWake). One byte on the announcing connection, sent without
// blocking: an owner that does not read it (stopped) loses it, and the op
// waits for its next look as before. The owner sends its proof on the
// connection, as on every one, and nothing else unless it is of an
// earlier version, which answers the byte with a refusal: the first such
// answer found stops the wakes, so that unread answers never fill the
// connection, block the owner's writes and end the announcement. at is
// when the op began: the caller's clock read, not one more.
func (p *sameNodePeer) wakeOwner(at time.Time) {
	now := int64(at.Sub(clockStart))
	if last := p.shmAt.Swap(now); last != 0 && now-last < int64(wakeAfter) {
		return
	}
	p.sendWake()
}

// sendWake writes announceWake on the announcing connection (wakeOwner),
// unless the owner is of an earlier version, which answers it.
func (p *sameNodePeer) sendWake() {
	p.annMu.Lock()
	defer p.annMu.Unlock()
	if p.annConn == nil || p.noWake {
		return
	}
	rc, err := p.annConn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Control(func(fd uintptr) {
		var b [len(proofMagic)]byte
		for {
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_DONTWAIT)
			if err != nil || n <= 0 {
				break // nothing unread
			}
			if !p.proofRead && n == len(b) && string(b[:]) == proofMagic {
				p.proofRead = true // what the owner sends on every connection
				continue
			}
			if p.outRefused < p.outSent {
				// The refusal of a name (tellOut): an owner of an
				// earlier version, which may know wakes all the same.
				p.outRefused++
				continue
			}
			p.noWake = true // an answer: the owner does not know the byte
			return
		}
		_ = unix.Send(int(fd), wakeMsg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	})
}

// wakeAfter is how long after its previous shm op toward an owner a peer
// wakes the owner's loop (wakeOwner): half the default poll policy's Spin,
// the owner's looking after activity. An owner whose Spin is shorter than
// wakeAfter may sleep through the gap between two ops that lie between
// its Spin and wakeAfter apart, up to its MaxSleep.
const wakeAfter = progress.DefaultSpin / 2

var (
	wakeMsg     = []byte{announceWake}
	reverifyMsg = []byte{announceReverify}
	cleanMsg    = []byte{announceClean}
	clockStart  = time.Now() // wakeOwner's clock: monotonic
)

// endAnnouncement closes the announcement with the verified connection.
func (p *sameNodePeer) endAnnouncement() {
	p.annMu.Lock()
	defer p.annMu.Unlock()
	p.ended = true
	if p.annConn != nil {
		_ = p.annConn.Close()
		p.annConn = nil
	}
}

// closeMem ends the mem route to p, for good.
func (p *sameNodePeer) closeMem() {
	p.memMu.Lock()
	l := p.link
	if p.memEnd != nil && !p.memDone {
		close(p.memEnd) // requests waiting for a dial hear it
	}
	if p.dialConn != nil {
		_ = p.dialConn.Close() // the dial ends now, not at its timeout
	}
	p.link, p.memDone = nil, true
	p.up.Store(nil)
	p.memMu.Unlock()
	if l != nil {
		l.close()
	}
}

// guardLoc is where a guard table is read, and its key.
type guardLoc struct{ table, key uint64 }

// guardFor is the owner's guard table as the route that reads it sees it.
func (p *sameNodePeer) guardFor(provider string) guardLoc {
	if provider == cma.Name || provider == mem.Name {
		return p.cma
	}
	return p.shm
}

// verifySocket is the abstract socket name of a manager's verifier.
func verifySocket(id ID) string { return "@fitransfer/" + id.String() }

// proof is what a manager tells a verified peer about itself.
func (m *Manager) proof() []byte {
	b := make([]byte, 0, 64)
	b = append(b, proofMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(os.Getpid()))
	b = binary.LittleEndian.AppendUint64(b, m.guard.base)
	b = binary.LittleEndian.AppendUint64(b, m.guard.id)
	var shm guardLoc
	var name []byte
	if sn := m.backends().sameNode; sn != nil && sn.Scratch != nil {
		shm = guardLoc{table: mr.RemoteAddr(sn.VirtAddr, uintptr(m.guard.base), 0), key: sn.Scratch.TableKey()}
		name = sn.EndpointName()
	}
	b = binary.LittleEndian.AppendUint64(b, shm.table)
	b = binary.LittleEndian.AppendUint64(b, shm.key)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// parseProof decodes a verifier's answer into p (all but what the kernel
// tells) and returns the pid the answer claims.
func parseProof(b []byte, p *sameNodePeer) (pid int, err error) {
	if len(b) < proofHeader || string(b[:4]) != proofMagic {
		return 0, errors.New("not a fitransfer verifier answer")
	}
	u64 := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	pid = int(binary.LittleEndian.Uint32(b[4:]))
	p.cma = guardLoc{table: u64(8), key: u64(16)}
	p.shm = guardLoc{table: u64(24), key: u64(32)}
	n := int(binary.LittleEndian.Uint16(b[40:]))
	if n > maxEPNameLen || len(b) != proofHeader+n {
		return 0, errors.New("malformed verifier answer")
	}
	if n > 0 {
		p.shmName = append([]byte(nil), b[proofHeader:]...)
	}
	return pid, nil
}

// verifier is a manager's listening side.
type verifier struct {
	ln    *net.UnixListener
	mu    sync.Mutex
	conns map[*net.UnixConn]*verifiedPeer
	// perPID counts conns by process (admits).
	perPID map[int]int
	// deaths counts the peers seen to die or leave (takeDeaths), each
	// process once however many connections it had.
	deaths uint64
	wg     sync.WaitGroup
	// stop ends what the connections' goroutines wait for (a self check)
	// when the manager closes.
	stop   context.Context
	cancel context.CancelFunc
}

// verifiedPeer is the process at the other end of a verifier connection,
// as the kernel named it.
type verifiedPeer struct {
	pid   int
	pidfd int  // -1 when pidfd_open failed: proc.Gone then
	dead  bool // its exit, or the end of its connection, was seen (takeDeaths)
}

// startVerifier listens for peers that want to verify this manager.
func (m *Manager) startVerifier() error {
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: verifySocket(m.id), Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("same-node verifier socket: %w", err)
	}
	v := &verifier{ln: ln, conns: map[*net.UnixConn]*verifiedPeer{}}
	v.stop, v.cancel = context.WithCancel(context.Background())
	m.verifier = v
	uid := uint32(os.Geteuid())
	v.wg.Add(1)
	go func() {
		defer v.wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				time.Sleep(10 * time.Millisecond) // EMFILE and the like: try again
				continue
			}
			cred, err := peerCred(c)
			if err != nil || cred.Uid != uid {
				_ = c.Close() // another user's process learns nothing
				continue
			}
			if !v.admits(int(cred.Pid)) {
				_ = c.Close() // its other connections go on
				continue
			}
			if !v.track(c, int(cred.Pid)) {
				_ = c.Close()
				return
			}
			v.wg.Add(1)
			go func() {
				defer v.wg.Done()
				defer v.untrack(c)
				// A peer that has just verified this manager may send its
				// first shm op right away, before its announcement (below)
				// is read here, and a peer of an earlier version sends
				// none: the shm loop polls for firstOpGrace from the start.
				grace := m.attendSameNode()
				timer := time.AfterFunc(firstOpGrace, grace)
				defer func() { timer.Stop(); grace() }()
				if _, err := c.Write(m.proof()); err != nil {
					return
				}
				m.serveMem(c, int(cred.Pid)) // held open until the peer or Close ends it
				m.afterPeerDeaths(c)
			}()
		}
	}()
	return nil
}

// wakeSameNode makes the shm loop look now and for its Spin: a verified
// peer's shm op is on its way (wakeOwner).
func (m *Manager) wakeSameNode() {
	if sn := m.backends().sameNode; sn != nil {
		sn.Wake()
	}
}

// attendSameNode keeps the shm loop polling for a verified peer until
// the returned release is called; a replacement of the endpoint that
// waited for its peers to leave it may follow then (rotateIfFull).
func (m *Manager) attendSameNode() (release func()) {
	if sn := m.backends().sameNode; sn != nil {
		end := sn.Attend()
		var once sync.Once
		return func() {
			once.Do(func() {
				end()
				m.rotateIfFull(sn)
			})
		}
	}
	return func() {}
}

// admits reports whether a new connection of process pid may be served:
// each costs a socket, a pidfd and a goroutine (and a mem link a use
// page), so a process of this user that opened connections without end
// ran its owner out of descriptors (an attacker's review). A process's
// managers need a few each; maxVerifierConnsPerPID and maxVerifierConns
// leave legitimate peers far below.
func (v *verifier) admits(pid int) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.perPID[pid] < maxVerifierConnsPerPID && len(v.conns) < maxVerifierConns
}

// The bounds of admits.
const (
	maxVerifierConnsPerPID = 256
	maxVerifierConns       = 4096
)

func (v *verifier) track(c *net.UnixConn, pid int) bool {
	// The peer is connected, so pid is its process, not a reused number.
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		fd = -1
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.conns == nil {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		return false
	}
	v.conns[c] = &verifiedPeer{pid: pid, pidfd: fd}
	if v.perPID == nil {
		v.perPID = map[int]int{}
	}
	v.perPID[pid]++
	return true
}

func (v *verifier) untrack(c *net.UnixConn) {
	v.mu.Lock()
	p := v.conns[c]
	if p != nil {
		v.forget(c, p)
	}
	v.mu.Unlock()
	_ = c.Close()
	if p != nil && p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
}

// takeDeaths counts the peers that died or left: left's, when not nil —
// a process that dies closes its sockets before its pidfd says it
// exited, so the end of its connection is the earlier sign — or else
// those whose pidfd says they exited. It returns the count so far.
func (v *verifier) takeDeaths(left *net.UnixConn) uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if left != nil {
		if p := v.conns[left]; p != nil && !p.dead {
			v.died(p.pid)
		}
		return v.deaths
	}
	fds := make([]unix.PollFd, 0, len(v.conns))
	for _, p := range v.conns {
		switch {
		case p.dead:
		case p.pidfd >= 0:
			fds = append(fds, unix.PollFd{Fd: int32(p.pidfd), Events: unix.POLLIN})
		default:
			if gone, _ := proc.Gone(p.pid); gone {
				v.died(p.pid)
			}
		}
	}
	// One poll for all: a pidfd polls readable once its process exited.
	if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
		for _, fd := range fds {
			if fd.Revents&unix.POLLIN == 0 {
				continue
			}
			for _, p := range v.conns {
				if p.pidfd == int(fd.Fd) && !p.dead {
					v.died(p.pid)
				}
			}
		}
	}
	return v.deaths
}

// died marks every connection of pid's process as dead and counts it
// once. Under v.mu.
func (v *verifier) died(pid int) {
	for _, p := range v.conns {
		if p.pid == pid {
			p.dead = true
		}
	}
	v.deaths++
}

// deathCount is the count takeDeaths returns, without looking.
func (v *verifier) deathCount() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.deaths
}

// dropPeers ends the connections of the peers verified so far: they
// verify again, and learn what changed.
func (v *verifier) dropPeers() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for c, p := range v.conns {
		// Without waiting: a peer that reads nothing must not hold this
		// up. One that misses the byte takes the end for the owner's.
		if rc, err := c.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				_ = unix.Send(int(fd), reverifyMsg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
			})
		}
		_ = c.Close()
		// Untracked here: its serving goroutine must not count the end
		// as the peer's death (takeDeaths), which would mark the peer's
		// new connections dead too, and miss its real death later.
		if p.pidfd >= 0 {
			_ = unix.Close(p.pidfd)
		}
		v.forget(c, p)
	}
}

// forget takes c, p's connection, off the verifier's books. Under v.mu.
func (v *verifier) forget(c *net.UnixConn, p *verifiedPeer) {
	delete(v.conns, c)
	if n := v.perPID[p.pid]; n > 1 {
		v.perPID[p.pid] = n - 1
	} else {
		delete(v.perPID, p.pid) // a nil map too: tests make verifiers of their own
	}
}

// close stops listening and ends every verified peer's connection.
func (v *verifier) close() {
	_ = v.ln.Close()
	v.cancel()
	v.mu.Lock()
	for c, p := range v.conns {
		_ = c.Close()
		if p.pidfd >= 0 {
			_ = unix.Close(p.pidfd)
		}
	}
	v.conns = nil // untrack finds nothing more to close; track refuses
	v.perPID = nil
	v.mu.Unlock()
	v.wg.Wait()
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// peers caches the verification of owners, by manager ID: a failure is
// kept too (the owner's manager, its uid and its namespaces do not change).
type peers struct {
	mu   sync.Mutex
	byID map[ID]*verification
	// reverified: when a disagreeing handle last made the manager verify
	// an owner again (reverify), by owner: the verification it makes is
	// new, and a limit kept on it would let the next op ask again.
	reverified map[ID]time.Time
	closed     bool          // the manager closed: a verification that ends now ends its connection
	runs       atomic.Uint64 // verifications run (tests)
}

// verification is one verification of an owner. It runs in a goroutine
// of its own: requests wait for it only as long as their deadline allows
// (await), and one that gives up leaves the result to the next.
type verification struct {
	start   sync.Once
	ready   chan struct{} // closed once the fields below are set
	peer    *sameNodePeer
	err     error
	gonePID int       // the owner answered an earlier verification, and is gone now
	expires time.Time // a failure that may not last (no answer): verify again after it
	// timedOut: the owner took the connection and did not answer within
	// verifyTimeout (stopped, say), or refused it at once (its queue of
	// connections full). Requests verify it again from expires on.
	timedOut bool
	done     atomic.Bool // the fields above are set
}

// awaitError is a request whose context or deadline ended while it
// waited for a same-node owner's answer: nothing moved. prepare makes it
// the op's *progress.TimeoutError (awaited).
type awaitError struct {
	what     string // what it waited for
	provider string // the route it would have taken
	pid      int    // the owner's process (the handle's word when not verified yet)
	cause    error
}

func (e *awaitError) Error() string {
	if errors.Is(e.cause, ErrClosed) {
		return fmt.Sprintf("waiting for %s (process %d): %v", e.what, e.pid, e.cause)
	}
	return fmt.Sprintf("gave up waiting for %s (process %d): %v; it may be stopped, overloaded or not serving its endpoint", e.what, e.pid, e.cause)
}

func (e *awaitError) Unwrap() error { return e.cause }

// awaitingVerification is the *awaitError of a request whose limits
// ended (err) while it waited for an owner's verification; route names
// the owner.
func awaitingVerification(err error) *awaitError {
	return &awaitError{what: "the owner's answer to its verification", cause: err}
}

// Is reports whether target is ErrTimeout and the cause a deadline.
func (e *awaitError) Is(target error) bool {
	return target == ErrTimeout && errors.Is(e.cause, context.DeadlineExceeded)
}

const (
	// maxVerified bounds the owners a manager keeps verifications of:
	// handles can name any number of owners.
	maxVerified = 1024
	// retryVerify is how long a verification that got no answer stands.
	retryVerify = time.Second
	// reverifyAfter is how often at most a handle that disagrees with a
	// verification makes the manager ask the owner again.
	reverifyAfter = time.Second
	// maxRetake is how many verifications of an owner replacing the one
	// it took a request takes in turn while it routes (route).
	maxRetake = 2
)

// entry returns the verification of owner, a new one when there is none
// or its failure expired. Under p.mu.
func (p *peers) entry(owner ID) *verification {
	if p.byID == nil {
		p.byID = map[ID]*verification{}
	}
	v := p.byID[owner]
	if v != nil && (v.expires.IsZero() || time.Now().Before(v.expires)) {
		return v
	}
	if v == nil && len(p.byID) >= maxVerified {
		p.evict()
	}
	v = &verification{ready: make(chan struct{})}
	p.byID[owner] = v
	return v
}

// evict drops half the entries, failed ones first; a dropped owner is
// verified again when a handle names it. Under p.mu.
func (p *peers) evict() {
	n := 0
	for id, v := range p.byID {
		if n >= maxVerified/2 {
			return
		}
		if !settled(v) || v.peer != nil && !v.peer.gone.Load() {
			continue
		}
		delete(p.byID, id)
		n++
	}
	for id, v := range p.byID {
		if n >= maxVerified/2 {
			return
		}
		if !settled(v) {
			continue
		}
		if v.peer != nil {
			v.peer.replaced.Store(true)
			_ = v.peer.conn.Close()
		}
		delete(p.byID, id)
		n++
	}
}

// settled reports whether v's verification has run (its fields are set).
func settled(v *verification) bool { return v.done.Load() }

// sameNodePeer verifies the owner of r's buffer (once per owner manager)
// and returns it, or why no same-node route may be used toward it: a
// *progress.PeerGoneError when the owner, verified before, is gone.
//
// It waits for a verification within t's limits: past them it returns
// an *awaitError (whose pid is 0: route names the handle's).
func (m *Manager) sameNodePeer(t *reqTimes, owner ID) (*sameNodePeer, error) {
	for {
		p, err := m.sameNodePeerOnce(t, owner)
		if err != errVerifyAgain {
			return p, err
		}
	}
}

// errVerifyAgain: the verification a request waited for timed out, and
// the request's deadline is still ahead: it verifies the owner again.
var errVerifyAgain = errors.New("verify again")

// sameNodePeerOnce is sameNodePeer's round: errVerifyAgain when the
// verification it waited for timed out.
func (m *Manager) sameNodePeerOnce(t *reqTimes, owner ID) (*sameNodePeer, error) {
	m.verified.mu.Lock()
	v := m.verified.entry(owner)
	m.verified.mu.Unlock()
	if err := m.await(t, v, owner, 0); err != nil {
		return nil, err
	}
	switch {
	case v.timedOut:
		return nil, m.verifyAgain(t, v)
	case v.gonePID != 0:
		return nil, peerGone(v.gonePID)
	case v.err != nil:
		return nil, v.err
	case !v.peer.gone.Load() && !v.peer.replaced.Load():
		return v.peer, nil
	}
	// The owner's side ended: it exited or closed its manager (gone), or
	// it replaced its shm endpoint and wants peers to verify it again, or
	// this manager did (replaced). entry takes the verification that
	// replaced v, or starts one (reverify or evict may have taken v out
	// before putting the next in).
	m.verified.mu.Lock()
	if m.verified.byID[owner] == v {
		delete(m.verified.byID, owner)
	}
	again := m.verified.entry(owner)
	m.verified.mu.Unlock()
	gone := v.peer.gone.Load()
	gonePID := 0
	if gone {
		gonePID = v.peer.pid // an owner that answered before and no longer does is gone
	}
	if err := m.await(t, again, owner, gonePID); err != nil {
		return nil, err
	}
	switch {
	case again.gonePID != 0:
		return nil, peerGone(again.gonePID)
	case again.err != nil && gone:
		return nil, peerGone(v.peer.pid)
	case again.timedOut:
		return nil, m.verifyAgain(t, again)
	case again.err != nil:
		return nil, again.err // a replaced owner's failure passes, as any verification's
	case again.peer.gone.Load():
		return nil, peerGone(v.peer.pid)
	}
	return again.peer, nil
}

// verifyAgain is errVerifyAgain once v's failure expired, waiting for
// that within t's limits: a verification that fails at once (an owner
// whose queue of connections is full refuses them) is not run again in a
// loop. Past the limits it returns an *awaitError.
func (m *Manager) verifyAgain(t *reqTimes, v *verification) error {
	if wait := time.Until(v.expires); wait > 0 {
		ch := make(chan struct{})
		tm := time.AfterFunc(wait, func() { close(ch) })
		defer tm.Stop()
		if err := t.waitFor(ch, nil); err != nil {
			return awaitingVerification(err)
		}
	}
	return errVerifyAgain
}

// await starts v's verification of owner, unless it started, and waits
// for it within t's limits: toward an owner that takes the connection
// and does not answer (stopped, say) a verification takes up to
// verifyTimeout, and the request's error must come by its own deadline.
// Past it, it returns an *awaitError; the verification goes on, for the
// next request.
func (m *Manager) await(t *reqTimes, v *verification, owner ID, gonePID int) error {
	if v.done.Load() {
		return nil
	}
	v.start.Do(func() { go m.verify(v, owner, gonePID) })
	if err := t.waitFor(v.ready, nil); err != nil {
		return awaitingVerification(err)
	}
	return nil
}

// verify runs the verification of owner into v. A failure that may pass
// stands for retryVerify when nobody answered, and until verifyTimeout
// after its start when the owner did not answer in time (timedOut); a refusal
// (another uid, this process) stands for good, and so does the failure of
// an owner that answered before (gonePID: it is gone). A verification that
// ends after the manager closed ends its connection.
func (m *Manager) verify(v *verification, owner ID, gonePID int) {
	start := time.Now()
	m.verified.runs.Add(1)
	peer, err := verifyOwner(owner, m.forgetSameNode)
	var ne net.Error
	m.verified.mu.Lock()
	v.peer, v.err = peer, err
	switch {
	case err != nil && gonePID != 0:
		v.gonePID = gonePID
	case errors.As(err, &ne) && ne.Timeout():
		// Verified again at once after a wait for an answer; after a
		// refusal that came at once (a full queue), from verifyTimeout on.
		v.timedOut, v.expires = true, start.Add(verifyTimeout)
	case errors.Is(err, errNoAnswer):
		v.expires = time.Now().Add(retryVerify)
	}
	v.done.Store(true) // under the lock: close sees it settled, or this sees closed
	closed := m.verified.closed
	m.verified.mu.Unlock()
	close(v.ready)
	if closed && peer != nil {
		_ = peer.conn.Close()
		peer.closeMem()
	}
}

// peerGone is the error of an op toward a same-node owner, process pid,
// that is gone; a new error each time, for the caller to complete.
func peerGone(pid int) *progress.PeerGoneError {
	why := "its manager closed: the connection it was verified over ended"
	if gone, w := proc.Gone(pid); gone {
		why = w
	}
	return &progress.PeerGoneError{Peer: cma.Peer(pid), Cause: why}
}

// reverify drops what the verification of owner, old, said, and verifies
// it again.
func (m *Manager) reverify(t *reqTimes, owner ID, old *sameNodePeer) (*sameNodePeer, error) {
	m.verified.mu.Lock()
	v := m.verified.byID[owner]
	if !m.verified.mayReverify(owner, time.Now()) {
		m.verified.mu.Unlock()
		return old, nil // asked it again a moment ago: the handle is what disagrees
	}
	m.verified.mu.Unlock()
	if v != nil {
		// A verification under way finishes first (its starter, which
		// made it, starts it at once).
		if err := t.waitFor(v.ready, nil); err != nil {
			return nil, awaitingVerification(err)
		}
		m.verified.mu.Lock()
		if m.verified.byID[owner] == v && v.peer == old {
			delete(m.verified.byID, owner)
		}
		m.verified.mu.Unlock()
	}
	old.replaced.Store(true)
	_ = old.conn.Close()
	return m.sameNodePeer(t, owner)
}

// mayReverify reports whether owner may be verified again at now (at most
// every reverifyAfter), and if so notes it. Under p.mu.
func (p *peers) mayReverify(owner ID, now time.Time) bool {
	if at, ok := p.reverified[owner]; ok && now.Sub(at) < reverifyAfter {
		return false
	}
	if p.reverified == nil {
		p.reverified = map[ID]time.Time{}
	}
	if len(p.reverified) >= maxVerified {
		// Owners asked again are verified ones (a forged owner fails its
		// verification first): few within reverifyAfter.
		for id, at := range p.reverified {
			if now.Sub(at) >= reverifyAfter {
				delete(p.reverified, id)
			}
		}
	}
	p.reverified[owner] = now
	return true
}

// shmMismatch says why own, this manager's first shm endpoint, must not
// talk to p's (libfabric.Route.ShmMismatch), looked at once a
// verification (again while either region cannot be read); "" when they
// may.
func (p *sameNodePeer) shmMismatch(own *libfabric.Route) string {
	switch p.shmFormat.Load() {
	case 1:
		return ""
	case 2:
		p.shmMu.Lock()
		defer p.shmMu.Unlock()
		return p.shmWhy
	}
	p.shmMu.Lock()
	defer p.shmMu.Unlock()
	if p.shmFormat.Load() == 0 {
		why, known := own.ShmMismatch(p.shmName)
		switch {
		case !known:
			return "" // looked at again next time
		case why == "":
			p.shmFormat.Store(1)
		default:
			p.shmWhy = why
			p.shmFormat.Store(2)
		}
	}
	return p.shmWhy
}

// errNoAnswer is a verification that found no manager listening: the
// owner exited, closed its manager, or runs in another network namespace.
var errNoAnswer = errors.New("no verified same-node owner: its manager does not answer on this node")

// verifyOwner connects to the verifier of manager owner and checks what
// the kernel says about the process at the other end.
func verifyOwner(owner ID, onGone func(*sameNodePeer)) (*sameNodePeer, error) {
	d := net.Dialer{Timeout: verifyTimeout}
	nc, err := d.Dial("unixpacket", verifySocket(owner))
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		// Its manager listens, and takes no connection (its backlog is
		// full: stopped, say): a timeout, verified again (verify).
		return nil, fmt.Errorf("no verified same-node owner: its manager takes no connection: %w", err)
	case err != nil:
		return nil, fmt.Errorf("%w (%v)", errNoAnswer, errors.Unwrap(err))
	}
	c := nc.(*net.UnixConn)
	fail := func(format string, a ...any) (*sameNodePeer, error) {
		_ = c.Close()
		return nil, fmt.Errorf("no verified same-node owner: "+format, a...)
	}
	cred, err := peerCred(c)
	if err != nil {
		return fail("reading the socket's peer credentials: %v", err)
	}
	switch {
	case int(cred.Pid) == os.Getpid():
		return fail("the handle names a manager of this very process that is not open here; a handle never makes a process act on itself")
	case cred.Uid != uint32(os.Geteuid()):
		return fail("its process %d runs as uid %d, this one as %d: only processes of one user act on each other's memory", cred.Pid, cred.Uid, os.Geteuid())
	}
	_ = c.SetReadDeadline(time.Now().Add(verifyTimeout))
	b := make([]byte, proofMaxSize+1)
	n, err := c.Read(b)
	if err == nil && n == 1 && b[0] == announceReverify || errors.Is(err, io.EOF) {
		// It ended this connection before its proof: it is verifying
		// its peers again (dropPeers), or closing. A failure that passes.
		_ = c.Close()
		return nil, fmt.Errorf("%w (process %d ended the connection before its proof)", errNoAnswer, cred.Pid)
	}
	if err != nil {
		return fail("process %d did not answer: %w", cred.Pid, err) // %w: a timeout is verified again (verify)
	}
	p := &sameNodePeer{conn: c, owner: owner}
	pid, err := parseProof(b[:n], p)
	if err != nil {
		return fail("process %d: %v", cred.Pid, err)
	}
	if pid != int(cred.Pid) {
		return fail("process %d claims to be process %d", cred.Pid, pid)
	}
	if p.shmName != nil && libfabric.ShmPeerPID(p.shmName) != pid {
		return fail("process %d names an shm endpoint of process %d", pid, libfabric.ShmPeerPID(p.shmName))
	}
	_ = c.SetReadDeadline(time.Time{})
	p.pid = pid
	go p.watch(c, onGone)
	return p, nil
}

// watch waits for the end of the verified connection c to p and says
// what it means: the owner's side ended it (it closed its manager or
// exited: gone), or asked to be verified again first (announceReverify),
// or this manager ended it (replaced). forget releases what shm holds
// for the owner's shm address (forgetSameNode), which only this manager's
// own ending leaves valid.
func (p *sameNodePeer) watch(c *net.UnixConn, forget func(*sameNodePeer)) {
	var b [1]byte
	n, _ := c.Read(b[:]) // returns when either side ends it, or with the owner's announceReverify
	_ = c.Close()
	p.endAnnouncement()
	if n == 1 && b[0] == announceReverify {
		p.replaced.Store(true) // before the links end: ops that meet them ask the kernel
	}
	if p.replaced.Load() {
		// Not a sign that the owner died: ops on the link finish, or
		// find it ended before they copied (memLinkEnded: nothing
		// moved), and the next op verifies the owner again.
		p.closeMem()
		if n == 1 && b[0] == announceReverify {
			forget(p) // its old shm endpoint
		}
		return
	}
	p.gone.Store(true)
	p.closeMem()
	forget(p)
}

// forgetSameNode releases what shm holds for an owner that is gone: the
// mapping of its region, on each shm endpoint that may have inserted it.
func (m *Manager) forgetSameNode(p *sameNodePeer) {
	if p.shmName == nil {
		return
	}
	for _, b := range m.backends().all {
		if b.Provider == fabric.BackendSHM && !b.Retired.Load() { // a retired one forgets its peers itself, or is stuck
			b.Forget(p.shmName)
		}
	}
}

// close ends the connections to verified owners, first telling each,
// when clean, that this manager's Outgoing endpoints have no op in
// flight (announceClean).
func (p *peers) close(clean bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true // a verification under way ends its own (verify)
	for _, v := range p.byID {
		if settled(v) && v.peer != nil {
			if clean {
				v.peer.sayClean()
			}
			_ = v.peer.conn.Close()
			v.peer.closeMem()
		}
	}
}

// wakeAll wakes every verified owner's shm loop (sendWake): the
// closing manager's shm endpoints wait for owners to map their regions
// (Manager.Close).
func (p *peers) wakeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.byID {
		if settled(v) && v.peer != nil {
			v.peer.sendWake()
		}
	}
}

// sayClean writes announceClean on the announcing connection, without
// blocking, when an Outgoing endpoint was named there.
func (p *sameNodePeer) sayClean() { p.sayOnAnnounce(cleanMsg) }

// sayOnAnnounce writes msg on the announcing connection, without
// blocking, when an Outgoing endpoint was named there.
func (p *sameNodePeer) sayOnAnnounce(msg []byte) {
	p.annMu.Lock()
	defer p.annMu.Unlock()
	if p.annConn == nil || p.outSent == 0 || p.outRefused > 0 {
		return
	}
	if rc, err := p.annConn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.Send(int(fd), msg, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		})
	}
}

// sayDone tells every verified owner named an Outgoing endpoint that b,
// one of them, closed drained (announceDone); owners it was not named to
// ignore it.
func (p *peers) sayDone(b *libfabric.Route) {
	msg := append([]byte{announceDone}, b.EndpointName()...)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, v := range p.byID {
		if settled(v) && v.peer != nil && int64(b.Index) < v.peer.told.Load() {
			v.peer.sayOnAnnounce(msg)
		}
	}
}

// sameNodeRefusal explains why a same-node handle did not get a
// same-node route.
func sameNodeRefusal(err error) string {
	return strings.TrimPrefix(err.Error(), "no verified same-node owner: ")
}
