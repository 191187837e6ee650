package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/completion"
	"github.com/fitransfer/fitransfer/fabric"
)

// A tcp;ofi_rxm peer whose process died does not always make its ops
// fail: rxm may keep answering posts with -FI_EAGAIN while it tries to
// reconnect, until the deadline. So when a tcp job has not completed a
// chunk for stallProbeAfter, fitransfer dials the peer's endpoint address
// once (in the background): "connection refused" means nothing listens
// there any more, and the job ends at once with a *completion.PeerGoneError.
// A live peer (even a stopped one: the kernel still completes the
// handshake) sees a connection that closes at once, which its listener
// drops.

const stallProbeAfter = time.Second

// probe states, in the low bits of tcpProbe.state; the bits above are
// the probe's generation, so that a dial still running when its job ended
// cannot touch the job the xfer is reused for.
const (
	probeIdle uint64 = iota
	probeRunning
	probeRefused
	probeStateBits = 2
	probeStateMask = 1<<probeStateBits - 1
)

// tcpProbe is the stall watch of one tcp job (in its xfer).
type tcpProbe struct {
	name      []byte // the peer endpoint's raw sockaddr; nil when not tcp
	addr      string // its "host:port", worked out at the first probe
	completed int
	since     atomic.Int64  // UnixNano of the last progress or probe
	state     atomic.Uint64 // generation<<probeStateBits | state
}

func (p *tcpProbe) reset(name []byte) {
	p.name, p.addr, p.completed = name, "", 0
	p.since.Store(time.Now().UnixNano())
	gen := p.state.Load()>>probeStateBits + 1
	p.state.Store(gen<<probeStateBits | probeIdle)
}

// sockaddrHostPort is "host:port" of a raw sockaddr_in/in6, or "".
func sockaddrHostPort(b []byte) string {
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
func tcpPeerAlive(j *completion.Job) error {
	x := j.Tag.(*xfer)
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
			if p.addr = sockaddrHostPort(p.name); p.addr == "" {
				p.name = nil // not an address this probe can dial
				return nil
			}
		}
		gen := st &^ probeStateMask
		if !p.state.CompareAndSwap(st, gen|probeRunning) {
			return nil
		}
		go func(addr string) {
			next := probeIdle
			if nothingListens(addr) {
				next = probeRefused
			} else if p.state.Load() == gen|probeRunning {
				p.since.Store(time.Now().UnixNano())
			}
			p.state.CompareAndSwap(gen|probeRunning, gen|next) // not if the xfer moved on
		}(p.addr)
	}
	return nil
}

// tcpExplain classifies a tcp job that failed with cancellations and lost
// connections only, which do not say themselves whether the peer is gone.
// tcp;ofi_rxm flushes the ops of a connection that was shut down with
// FI_ECANCELED: the owner died, or it refused an op (its key, range or
// access check failed, and it closes the connection). Their prov_errno is
// the progress thread's leftover errno (ENOENT and ENOTCONN were both
// seen for a refusal), not a cause. An op posted to a connection already
// lost fails with FI_ENOTCONN (or another socket error). One dial of the
// peer's endpoint tells them apart: nothing listens there any more, and
// the peer is gone (ErrPeerGone); the owner still listens and shut the
// connection down under a cancelled op: it refused it (ErrStaleHandle —
// and so do ops of other requests that were in flight on that connection
// then: the provider does not say which op it refused); the owner still
// listens and the connection was already lost: transient, no
// explanation. It returns nil when the errors say enough already.
func tcpExplain(j *completion.Job, name []byte) error {
	if len(j.Errs) == 0 {
		return nil
	}
	refused := false
	for _, e := range j.Errs {
		var ce *completion.Error
		switch {
		case !errors.As(e, &ce):
			return nil // a timeout, or the stall probe's verdict: they explain it
		case ce.Errno == fabric.ErrCanceled:
			refused = true
		case completion.ConnGone(ce.Errno):
			// posted to a lost connection
		default:
			return nil // the others explain it
		}
	}
	addr := sockaddrHostPort(name)
	switch {
	case addr == "":
		return nil
	case nothingListens(addr):
		return tcpPeerGone(j, addr)
	case refused:
		return fmt.Errorf("%w: the owner at %s still listens but refused the op: its key, range or access check failed "+
			"(the buffer was closed, or the handle is stale or altered; tcp;ofi_rxm does not say which)", ErrStaleHandle, addr)
	}
	return nil
}

// nothingListens dials addr once: true when the connection is refused, or
// reset by a listener that is closing. A process being killed closes its
// connections and its listener one after the other, so a dial right after
// a lost connection can reach the listener's backlog just before it
// closes: then the connection is reset, during the dial or within
// closingListener after it. A live peer, even a stopped one (the kernel
// completes the handshake), sees a connection that closes at once.
func nothingListens(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(closingListener))
	var b [1]byte
	_, err = c.Read(b[:])
	return errors.Is(err, syscall.ECONNRESET)
}

// closingListener is how long nothingListens waits for the reset of a
// listener that is closing; it closes within the same exit as the
// connection whose loss led to the dial.
const closingListener = 20 * time.Millisecond

// tcpPeerGone is the error of a tcp job whose peer no longer listens.
func tcpPeerGone(j *completion.Job, addr string) error {
	return &completion.PeerGoneError{Op: j.Op, Provider: "tcp;ofi_rxm", Peer: j.PeerName,
		Cause: "nothing listens at " + addr + " any more (connection refused): its process exited or closed its endpoint"}
}
