package completion

import "github.com/fitransfer/fitransfer/fabric"

// Hint returns the likely meaning of a failed op and its fix, or "".
func Hint(provider string, errno fabric.Errno, provErrno int) string {
	connGone := func(e int) bool { return e == 107 || e == 104 || e == 111 || e == 32 } // ENOTCONN ECONNRESET ECONNREFUSED EPIPE
	switch {
	case provider == "tcp;ofi_rxm" && errno == fabric.ErrCanceled && connGone(provErrno):
		return "the connection to the peer is gone: the peer process exited or its endpoint closed"
	case provider == "tcp;ofi_rxm" && errno == fabric.ErrCanceled:
		return "tcp;ofi_rxm cancels an op when the target rejects its key or address (buffer closed, or handle altered or stale) or when the connection dropped"
	case errno == fabric.Errno(107) || errno == fabric.Errno(104) || errno == fabric.Errno(111): // ENOTCONN, ECONNRESET, ECONNREFUSED
		return "the connection to the peer is gone: the peer process exited or its endpoint closed"
	case errno == fabric.ErrHostUnreach:
		return "peer unreachable: on EFA usually a security group without its self-referencing rule, or peers in different subnets"
	case errno == fabric.ErrAccess || errno == fabric.ErrKeyRejected:
		return "the target refused access: the buffer was registered without that remote right, or closed"
	case errno == fabric.ErrTrunc:
		return "the op is longer than the remote region"
	}
	return ""
}
