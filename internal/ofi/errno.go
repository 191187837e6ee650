package ofi

/*
#include "ofi.h"
*/
import "C"

import "strconv"

// Errno is a positive libfabric error number (FI_E*), as returned negated by
// libfabric calls and as found in fi_cq_err_entry.err. Its text comes from
// fi_strerror. Compare with errors.Is against the Err* constants.
type Errno int

// Error returns libfabric's fi_strerror text followed by the number, so that
// a message is never a bare number and never text without the number.
func (e Errno) Error() string {
	return e.Text() + " (FI_" + e.Name() + " " + strconv.Itoa(int(e)) + ")"
}

// Text is fi_strerror's text for the error number.
func (e Errno) Text() string { return C.GoString(C.fi_strerror(C.int(e))) }

// Name is the symbolic name without the FI_ prefix ("EAGAIN"), or "E?" for
// numbers libfabric does not name.
func (e Errno) Name() string {
	if n, ok := errnoNames[e]; ok {
		return n
	}
	return "E?"
}

// Timeout reports whether the error is a timeout, for net.Error-style checks.
func (e Errno) Timeout() bool { return e == ErrTimedOut }

// Temporary reports whether retrying the same call later can succeed.
func (e Errno) Temporary() bool { return e == ErrAgain || e == ErrIntr }

// The libfabric error numbers fitransfer tests for. They equal the Linux
// errno values (FI_EAGAIN is EAGAIN), and the libfabric-specific ones start
// at 256; both are ABI and the same in 1.17 and 2.x.
const (
	ErrPerm        Errno = 1   // FI_EPERM
	ErrNoEnt       Errno = 2   // FI_ENOENT
	ErrIntr        Errno = 4   // FI_EINTR
	ErrIO          Errno = 5   // FI_EIO
	ErrTooBig      Errno = 7   // FI_E2BIG
	ErrBadF        Errno = 9   // FI_EBADF
	ErrAgain       Errno = 11  // FI_EAGAIN
	ErrNoMem       Errno = 12  // FI_ENOMEM
	ErrAccess      Errno = 13  // FI_EACCES
	ErrFault       Errno = 14  // FI_EFAULT
	ErrBusy        Errno = 16  // FI_EBUSY
	ErrNoDev       Errno = 19  // FI_ENODEV
	ErrInval       Errno = 22  // FI_EINVAL
	ErrMFile       Errno = 24  // FI_EMFILE
	ErrNoSpc       Errno = 28  // FI_ENOSPC
	ErrNoSys       Errno = 38  // FI_ENOSYS
	ErrNoMsg       Errno = 42  // FI_ENOMSG
	ErrNoData      Errno = 61  // FI_ENODATA
	ErrProto       Errno = 71  // FI_EPROTO (2.x)
	ErrOverflow    Errno = 75  // FI_EOVERFLOW
	ErrMsgSize     Errno = 90  // FI_EMSGSIZE
	ErrNoProtoOpt  Errno = 92  // FI_ENOPROTOOPT
	ErrOpNotSupp   Errno = 95  // FI_EOPNOTSUPP
	ErrAddrInUse   Errno = 98  // FI_EADDRINUSE
	ErrAddrNotAvai Errno = 99  // FI_EADDRNOTAVAIL
	ErrNetDown     Errno = 100 // FI_ENETDOWN
	ErrNetUnreach  Errno = 101 // FI_ENETUNREACH
	ErrConnAborted Errno = 103 // FI_ECONNABORTED
	ErrConnReset   Errno = 104 // FI_ECONNRESET
	ErrNoBufs      Errno = 105 // FI_ENOBUFS
	ErrIsConn      Errno = 106 // FI_EISCONN
	ErrNotConn     Errno = 107 // FI_ENOTCONN
	ErrShutdown    Errno = 108 // FI_ESHUTDOWN
	ErrTimedOut    Errno = 110 // FI_ETIMEDOUT
	ErrConnRefused Errno = 111 // FI_ECONNREFUSED
	ErrHostDown    Errno = 112 // FI_EHOSTDOWN
	ErrHostUnreach Errno = 113 // FI_EHOSTUNREACH
	ErrAlready     Errno = 114 // FI_EALREADY
	ErrInProgress  Errno = 115 // FI_EINPROGRESS
	ErrRemoteIO    Errno = 121 // FI_EREMOTEIO
	ErrCanceled    Errno = 125 // FI_ECANCELED
	ErrKeyRejected Errno = 129 // FI_EKEYREJECTED
	ErrOther       Errno = 256 // FI_EOTHER
	ErrTooSmall    Errno = 257 // FI_ETOOSMALL
	ErrOpBadState  Errno = 258 // FI_EOPBADSTATE
	ErrAvail       Errno = 259 // FI_EAVAIL
	ErrBadFlags    Errno = 260 // FI_EBADFLAGS
	ErrNoEQ        Errno = 261 // FI_ENOEQ
	ErrDomain      Errno = 262 // FI_EDOMAIN
	ErrNoCQ        Errno = 263 // FI_ENOCQ
	ErrCRC         Errno = 264 // FI_ECRC
	ErrTrunc       Errno = 265 // FI_ETRUNC
	ErrNoKey       Errno = 266 // FI_ENOKEY
	ErrNoAV        Errno = 267 // FI_ENOAV
	ErrOverrun     Errno = 268 // FI_EOVERRUN
	ErrNoRx        Errno = 269 // FI_ENORX
	ErrNoMR        Errno = 270 // FI_ENOMR (2.x)
)

var errnoNames = map[Errno]string{
	ErrPerm: "EPERM", ErrNoEnt: "ENOENT", ErrIntr: "EINTR", ErrIO: "EIO",
	ErrTooBig: "E2BIG", ErrBadF: "EBADF", ErrAgain: "EAGAIN", ErrNoMem: "ENOMEM",
	ErrAccess: "EACCES", ErrFault: "EFAULT", ErrBusy: "EBUSY", ErrNoDev: "ENODEV",
	ErrInval: "EINVAL", ErrMFile: "EMFILE", ErrNoSpc: "ENOSPC", ErrNoSys: "ENOSYS",
	ErrNoMsg: "ENOMSG", ErrNoData: "ENODATA", ErrProto: "EPROTO", ErrOverflow: "EOVERFLOW",
	ErrMsgSize: "EMSGSIZE", ErrNoProtoOpt: "ENOPROTOOPT", ErrOpNotSupp: "EOPNOTSUPP",
	ErrAddrInUse: "EADDRINUSE", ErrAddrNotAvai: "EADDRNOTAVAIL", ErrNetDown: "ENETDOWN",
	ErrNetUnreach: "ENETUNREACH", ErrConnAborted: "ECONNABORTED", ErrConnReset: "ECONNRESET",
	ErrNoBufs: "ENOBUFS", ErrIsConn: "EISCONN", ErrNotConn: "ENOTCONN", ErrShutdown: "ESHUTDOWN",
	ErrTimedOut: "ETIMEDOUT", ErrConnRefused: "ECONNREFUSED", ErrHostDown: "EHOSTDOWN",
	ErrHostUnreach: "EHOSTUNREACH", ErrAlready: "EALREADY", ErrInProgress: "EINPROGRESS",
	ErrRemoteIO: "EREMOTEIO", ErrCanceled: "ECANCELED", ErrKeyRejected: "EKEYREJECTED",
	ErrOther: "EOTHER", ErrTooSmall: "ETOOSMALL", ErrOpBadState: "EOPBADSTATE",
	ErrAvail: "EAVAIL", ErrBadFlags: "EBADFLAGS", ErrNoEQ: "ENOEQ", ErrDomain: "EDOMAIN",
	ErrNoCQ: "ENOCQ", ErrCRC: "ECRC", ErrTrunc: "ETRUNC", ErrNoKey: "ENOKEY", ErrNoAV: "ENOAV",
	ErrOverrun: "EOVERRUN", ErrNoRx: "ENORX", ErrNoMR: "ENOMR",
}

// CallError is a failed libfabric call: which call and its error number.
// errors.Is(err, ErrAgain) and errors.As(err, &errno) see the Errno.
type CallError struct {
	Call  string // the libfabric function, e.g. "fi_getinfo"
	Errno Errno
}

func (e *CallError) Error() string { return e.Call + ": " + e.Errno.Error() }

// Unwrap exposes the Errno to errors.Is / errors.As.
func (e *CallError) Unwrap() error { return e.Errno }

// check turns a libfabric return code into an error: nil for >= 0, else a
// *CallError naming the call.
func check(call string, rc C.int) error {
	if rc >= 0 {
		return nil
	}
	return &CallError{Call: call, Errno: Errno(-rc)}
}

// checkSize is check for the ssize_t returns of data-path calls.
func checkSize(call string, rc C.ssize_t) error {
	if rc >= 0 {
		return nil
	}
	return &CallError{Call: call, Errno: Errno(-rc)}
}
