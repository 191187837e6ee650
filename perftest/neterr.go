package perftest

import (
	"errors"
	"net"
	"syscall"
)

func errConnRefused() error { return syscall.ECONNREFUSED }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
