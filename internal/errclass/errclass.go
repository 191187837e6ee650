//lint:file-ignore ST1012 callers write errclass.PeerGone; transport exports each class as ErrX.

// Package errclass holds the sentinel errors of fitransfer's error
// vocabulary. The transport package exports them (transport.ErrPeerGone
// is PeerGone, and so on); they live here so that the typed errors of
// packages below transport, such as progress's, can match them in their
// Is methods without importing transport, which imports them.
package errclass

import "errors"

// The classes. Their texts are what errors that wrap them start with.
var (
	// PeerGone: the buffer's owner process exited (or its endpoint
	// closed) and nothing will ever answer there again.
	PeerGone = errors.New("peer gone")
	// StaleHandle: the owner no longer has the buffer the handle names,
	// or the handle was altered.
	StaleHandle = errors.New("stale or altered handle")
	// AccessDenied: the owner did not grant the remote right the op needs.
	AccessDenied = errors.New("access denied")
	// OutOfRange: a slice or handle range outside its buffer.
	OutOfRange = errors.New("out of range")
	// Timeout: the deadline passed before the transfer finished, or the
	// provider timed the op out.
	Timeout = errors.New("timed out")
	// Wedged: an endpoint stuck inside a libfabric call that does not
	// return; nothing more can be done on it.
	Wedged = errors.New("endpoint wedged")
)
