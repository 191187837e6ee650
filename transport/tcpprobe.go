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

// probe states
const (
	probeIdle int32 = iota
	probeRunning
	probeRefused
)

// tcpProbe is the stall watch of one tcp job (in its xfer).
type tcpProbe struct {
	addr      string // "host:port" of the peer endpoint; "" when not tcp
	completed int
	since     time.Time
	state     atomic.Int32
}

func (p *tcpProbe) reset(addr string) {
	p.addr, p.completed, p.since = addr, 0, time.Now()
	p.state.Store(probeIdle)
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
	if p.addr == "" {
		return nil
	}
	if j.Completed != p.completed {
		p.completed, p.since = j.Completed, time.Now()
		return nil
	}
	switch p.state.Load() {
	case probeRefused:
		return &completion.PeerGoneError{Op: j.Op, Provider: "tcp;ofi_rxm", Peer: j.PeerName,
			Cause: "nothing listens at " + p.addr + " any more (connection refused): its process exited or closed its endpoint"}
	case probeIdle:
		if time.Since(p.since) >= stallProbeAfter {
			p.state.Store(probeRunning)
			go func(addr string) {
				c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
				if err == nil {
					c.Close()
				}
				if errors.Is(err, syscall.ECONNREFUSED) {
					p.state.Store(probeRefused)
					return
				}
				p.since = time.Now()
				p.state.Store(probeIdle)
			}(p.addr)
		}
	}
	return nil
}
