package libfabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/progress"
)

// A tcp;ofi_rxm peer whose process died does not always make its ops
// fail: rxm may keep answering posts with -FI_EAGAIN while it tries to
// reconnect, until the deadline. So when a tcp job has not completed a
// chunk for stallProbeAfter, fitransfer dials the peer's endpoint address
// once (in the background, ownerLiveness): "connection refused" means
// nothing listens there any more, and the job ends at once with a
// *progress.PeerGoneError.
// A live peer (even a stopped one: the kernel still completes the
// handshake) sees a connection that closes at once, which its listener
// drops.

const stallProbeAfter = time.Second

// probe states, in the low bits of probe.state; the bits above are
// the probe's generation, so that a dial still running when its job ended
// cannot touch the job the xfer is reused for.
const (
	probeIdle uint64 = iota
	probeRunning
	probeRefused
	probeStateBits = 2
	probeStateMask = 1<<probeStateBits - 1
)

// probe is the stall watch of one tcp job (in its Xfer).
type probe struct {
	name      []byte // the peer endpoint's raw sockaddr; nil when not tcp
	addr      string // its "host:port", worked out at the first probe
	completed int
	since     atomic.Int64  // UnixNano of the last progress or probe
	state     atomic.Uint64 // generation<<probeStateBits | state
	drop      *drop         // the peer's last dropped connection (tcpdrop.go)
}

func (p *probe) reset(name []byte, drop *drop) {
	p.name, p.addr, p.completed, p.drop = name, "", 0, drop
	p.since.Store(time.Now().UnixNano())
	gen := p.state.Load()>>probeStateBits + 1
	p.state.Store(gen << probeStateBits) // state probeIdle
}

// SockaddrHostPort is "host:port" of a raw sockaddr_in/in6, or "".
func SockaddrHostPort(b []byte) string {
	if len(b) < 8 {
		return ""
	}
	port := int(binary.BigEndian.Uint16(b[2:4]))
	switch binary.LittleEndian.Uint16(b[0:2]) {
	case syscall.AF_INET:
		return net.JoinHostPort(net.IP(b[4:8]).String(), strconv.Itoa(port))
	case syscall.AF_INET6:
		if len(b) >= 24 {
			return net.JoinHostPort(net.IP(b[8:24]).String(), strconv.Itoa(port))
		}
	}
	return ""
}

// tcpPeerAlive is the Check of tcp jobs.
func tcpPeerAlive(j *progress.Job) error {
	x := j.Tag.(*Xfer)
	p := &x.probe
	if len(p.name) == 0 {
		return nil
	}
	if j.Completed != p.completed {
		p.completed = j.Completed
		p.since.Store(time.Now().UnixNano())
		return nil
	}
	st := p.state.Load()
	switch st & probeStateMask {
	case probeRefused:
		return tcpPeerGone(j, p.addr)
	case probeIdle:
		if time.Since(time.Unix(0, p.since.Load())) < stallProbeAfter {
			return nil
		}
		if p.addr == "" {
			if p.addr = SockaddrHostPort(p.name); p.addr == "" {
				p.name = nil // not an address this probe can dial
				return nil
			}
		}
		gen := st &^ probeStateMask
		if !p.state.CompareAndSwap(st, gen|probeRunning) {
			return nil
		}
		// No connection is known lost, and the last sign of life is at
		// least stallProbeAfter old: one dial, no wait; the probe repeats.
		lastProgress := time.Unix(0, p.since.Load())
		go func(addr string) {
			next := probeIdle
			if ownerLiveness(addr, lastProgress, time.Time{}) == ownerGone {
				next = probeRefused
			} else if p.state.Load() == gen|probeRunning {
				p.since.Store(time.Now().UnixNano())
			}
			p.state.CompareAndSwap(gen|probeRunning, gen|next) // not if the xfer moved on
		}(p.addr)
	}
	return nil
}

// Explain classifies a tcp job that failed only with the loss of its
// connection (connLost), which does not say itself whether the peer is
// gone. tcp;ofi_rxm flushes the ops in flight on a connection that was
// shut down with FI_ECANCELED: the owner died, or it refused an op (its
// key, range or access check failed, and the tcp provider has no other
// way to refuse an RMA op than closing the connection: tcpdrop.go). Their
// prov_errno is the progress thread's leftover errno (ENOENT and ENOTCONN
// were both seen for a refusal), not a cause. An op posted to a
// connection already lost fails with FI_ENOTCONN (or another socket
// error). ownerLiveness tells them apart:
//   - nothing listens: the peer is gone, a *progress.PeerGoneError
//     (ErrPeerGone);
//   - the owner still listens and shut the connection down under a
//     cancelled op: it refused it, an error wrapping ErrStaleHandle (and
//     so do ops of other requests that were in flight on that connection
//     then: the provider does not say which op it refused);
//   - the owner still listens and the op met a connection already lost:
//     transient, no explanation.
//
// When the owner listens, the chunk errors' hints name the rejection
// instead of an exited peer; when victim (the job met the connection an
// earlier rejection dropped, and RedoAfterDrop posted it again until
// staleConnWindow ran out), the earlier op. It returns nil when the errors
// say enough already, and an error wrapping ErrTimeout when the job's
// deadline came before the owner could be asked.
func Explain(j *progress.Job, name []byte, victim bool) error {
	if !connLost(j.Errs, false) {
		return nil // a timeout, the stall probe's verdict, other errors: they explain it
	}
	addr := SockaddrHostPort(name)
	if addr == "" {
		return nil
	}
	switch ownerLiveness(addr, time.Now(), j.Deadline) {
	case ownerGone:
		return tcpPeerGone(j, addr)
	case ownerUnknown:
		if j.Deadline.IsZero() || time.Now().Before(j.Deadline) {
			return nil // the dial failed otherwise (the host unreachable): the errors stand as they are
		}
		// Unexplained, the flushed ops had no class and were not
		// retryable, even ops of a valid handle that only met a
		// connection another op's refusal dropped (a new user's
		// review): given time, they would have been posted again.
		return fmt.Errorf("%w: the connection to the owner at %s dropped under the op, and the request's deadline came before "+
			"a dial of its endpoint could tell whether the owner refused an op (this one's handle, or another's in flight on "+
			"that connection) or is gone; with more time, an op that only met the dropped connection is posted again",
			errclass.ErrTimeout, addr)
	}
	hint := hintRejected
	if victim {
		hint = hintDroppedBefore + staleConnWindow.String() + "; the next op connects again"
	}
	refused := false
	for _, e := range j.Errs {
		var ce *progress.Error
		if errors.As(e, &ce) {
			ce.Hint = hint
			refused = refused || ce.Errno == fabric.ErrCanceled
		}
	}
	if !refused {
		return nil
	}
	return fmt.Errorf("%w: the owner at %s still listens but refused the op: its key, range or access check failed "+
		"(the buffer was closed, or the handle is stale or altered; tcp;ofi_rxm does not say which)", errclass.ErrStaleHandle, addr)
}

// liveness is what dialing a tcp owner's endpoint tells.
type liveness int

const (
	ownerUnknown liveness = iota // the dial timed out or failed otherwise: unreachable, maybe
	ownerGone                    // refused, or reset by a listener that is closing
	ownerListens
)

// ownerLiveness dials the owner's endpoint at addr to tell a live owner
// from one whose process exited or is exiting, after a connection to it
// was lost at lostAt. A refused dial means nothing listens there any
// more. A process being killed closes its connections and its listener
// one after the other (docs/RELIABILITY.md has the gap measured), so a
// dial soon after a lost connection
// can still reach the listener: until aliveRecheck after lostAt the
// connection is watched, and a listener that closes meanwhile resets it
// (the kernel resets what waits in a closing listener's backlog); then
// the owner is dialed once more, and a refusal means it is gone. A live
// owner, even a stopped one (the kernel completes the handshake), sees
// connections that close without a word. The wait is paid only by a dial
// within aliveRecheck of lostAt, and only after a failure or a stall.
// A request's answer is due by its deadline (by; none when zero): past
// it, the owner is ownerUnknown.
func ownerLiveness(addr string, lostAt, by time.Time) liveness {
	settled := lostAt.Add(aliveRecheck)
	watch := time.Now().Before(settled) // the listener may still be closing
	for {
		timeout := ownerDialTimeout
		if !by.IsZero() {
			left := time.Until(by)
			if left <= 0 {
				return ownerUnknown
			}
			timeout = min(timeout, left)
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		switch {
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
			return ownerGone
		case err != nil:
			return ownerUnknown
		case !watch:
			c.Close()
			return ownerListens
		}
		watch = false
		readBy := settled
		if !by.IsZero() && by.Before(readBy) {
			readBy = by
		}
		_ = c.SetReadDeadline(readBy)
		var b [1]byte
		_, err = c.Read(b[:])
		c.Close()
		if errors.Is(err, syscall.ECONNRESET) {
			return ownerGone
		}
		if !by.IsZero() && !time.Now().Before(by) {
			return ownerUnknown // before the listener had settled
		}
		time.Sleep(time.Until(settled)) // when the owner closed it early; then dial again
	}
}

// ownerDialTimeout bounds each of ownerLiveness's dials.
const ownerDialTimeout = 500 * time.Millisecond

// aliveRecheck is how long after a lost connection ownerLiveness still
// takes a listener for one that may be closing in its process's exit.
const aliveRecheck = 50 * time.Millisecond

// tcpPeerGone is the error of a tcp job whose peer no longer listens.
func tcpPeerGone(j *progress.Job, addr string) error {
	return &progress.PeerGoneError{Op: j.Op, Provider: string(fabric.BackendTCP), Peer: j.PeerName,
		Cause: "nothing listens at " + addr + " any more (connection refused): its process exited or closed its endpoint"}
}
