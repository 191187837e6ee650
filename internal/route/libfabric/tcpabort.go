package libfabric

import (
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
)

// AbortTCP makes the kernel drop what this process's TCP sockets on the
// route's local address still have to send, for a tcp;ofi_rxm route
// about to be closed because its link stopped: a write whose data sits
// unacknowledged in a socket's send queue would otherwise be sent again
// when the link comes back — after the transfer, redone over another
// rail, returned — and overwrite the owner's newer bytes. Closing the
// endpoint does not prevent that: libfabric 1.x's tcp cannot be closed
// with ops in flight (the route is abandoned, its sockets stay open), and
// a closed socket still sends what it queued. TCP_USER_TIMEOUT makes the
// kernel abort a connection at its next retransmission instead of
// retransmitting, and a zero linger makes a close reset it. It returns
// how many sockets it set; 0 on other providers.
func (r *Route) AbortTCP() int {
	if r.Provider != fabric.BackendTCP {
		return 0
	}
	hp := SockaddrHostPort(r.name)
	host, _, err := net.SplitHostPort(hp)
	if err != nil {
		return 0
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsUnspecified() {
		return 0
	}
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if link, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(link, "socket:") {
			continue
		}
		if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
			continue
		}
		if !boundTo(fd, ip) {
			continue
		}
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, 1)
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		n++
	}
	return n
}

// boundTo reports whether socket fd's local address is ip.
func boundTo(fd int, ip net.IP) bool {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return false
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return ip.Equal(net.IP(a.Addr[:]))
	case *unix.SockaddrInet6:
		return ip.Equal(net.IP(a.Addr[:]))
	}
	return false
}
