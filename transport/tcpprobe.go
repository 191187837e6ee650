package transport

import (
	"encoding/binary"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/completion"
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
	drop      *connDrop     // the peer's last dropped connection (tcpdrop.go)
}

func (p *tcpProbe) reset(name []byte, drop *connDrop) {
	p.name, p.addr, p.completed, p.drop = name, "", 0, drop
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

// tcpPeerGoneAfter explains a tcp job that failed only with the loss of
// its connection: FI_ENOTCONN, FI_ECONNRESET, EPIPE, or rxm's flush
// (FI_ECANCELED, whose prov_errno is whatever errno the thread had left:
// tcpx_cq_report_error, 1.17). An owner that exited and an owner that
// rejected an op's key and dropped the connection (tcpdrop.go) give the
// same errors; dialing the owner's endpoint tells them apart.
// "Connection refused" means nothing listens there any more: it returns
// a *completion.PeerGoneError. Two connections aliveRecheck apart mean
// the owner is alive: the chunk errors' hints then name the rejection,
// and, when victim (the job met a connection dropped before it started),
// the earlier op. It returns nil unless the peer is gone.
func tcpPeerGoneAfter(j *completion.Job, name []byte, victim bool) error {
	if !connLost(j.Errs, false) {
		return nil // not only a lost connection: the other errors explain it
	}
	addr := sockaddrHostPort(name)
	if addr == "" {
		return nil
	}
	state := dialPeer(addr)
	if state == peerListens || state == peerReset {
		// An exiting owner's sockets close one by one, the failed
		// connection before the listener maybe: ask again a moment later.
		time.Sleep(aliveRecheck)
		state = dialPeer(addr)
	}
	switch state {
	case peerRefused:
		return tcpPeerGone(j, addr)
	case peerListens:
		hint := hintRejected
		if victim {
			hint = hintDroppedBefore + staleConnWindow.String() + "; the next op connects again"
		}
		for _, e := range j.Errs {
			var ce *completion.Error
			if errors.As(e, &ce) {
				ce.Hint = hint
			}
		}
	}
	return nil
}

// aliveRecheck is how long after a first answer tcpPeerGoneAfter dials
// an owner again: a killed owner's listener was seen to outlive its
// failed connection by 1.4 ms.
const aliveRecheck = 50 * time.Millisecond

// nothingListens dials addr once: true when the connection is refused.
// A live peer, even a stopped one (the kernel completes the handshake),
// sees a connection that closes at once.
func nothingListens(addr string) bool { return dialPeer(addr) == peerRefused }

// dial outcomes
const (
	peerUnknown = iota // timed out, unreachable...
	peerRefused
	peerReset // the listener reset the connection: it may be closing
	peerListens
)

// dialPeer dials addr once and closes the connection at once.
func dialPeer(addr string) int {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	switch {
	case err == nil:
		c.Close()
		return peerListens
	case errors.Is(err, syscall.ECONNREFUSED):
		return peerRefused
	case errors.Is(err, syscall.ECONNRESET):
		return peerReset
	}
	return peerUnknown
}

// tcpPeerGone is the error of a tcp job whose peer no longer listens.
func tcpPeerGone(j *completion.Job, addr string) error {
	return &completion.PeerGoneError{Op: j.Op, Provider: "tcp;ofi_rxm", Peer: j.PeerName,
		Cause: "nothing listens at " + addr + " any more (connection refused): its process exited or closed its endpoint"}
}
