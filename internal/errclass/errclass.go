// Package errclass holds the sentinel errors of fitransfer's error
// vocabulary. The transport package exports them (transport.ErrPeerGone
// is ErrPeerGone, and so on); they live here so that the typed errors of
// packages below transport, such as progress's, can match them in their
// Is methods without importing transport, which imports them.
package errclass

import "errors"

// The classes. Their texts are what errors that wrap them start with.
var (
	// ErrPeerGone: the buffer's owner process exited (or its endpoint
	// closed) and nothing will ever answer there again.
	ErrPeerGone = errors.New("peer gone")
	// ErrStaleHandle: the owner no longer has the buffer the handle names,
	// or the handle was altered.
	ErrStaleHandle = errors.New("stale or altered handle")
	// ErrAccessDenied: the owner did not grant the remote right the op needs.
	ErrAccessDenied = errors.New("access denied")
	// ErrOutOfRange: a slice or handle range outside its buffer.
	ErrOutOfRange = errors.New("out of range")
	// ErrTimeout: the deadline passed before the transfer finished, or the
	// provider timed the op out.
	ErrTimeout = errors.New("timed out")
	// ErrWedged: an endpoint stuck inside a libfabric call that does not
	// return; nothing more can be done on it.
	ErrWedged = errors.New("endpoint wedged")
	// ErrBlocked: an shm endpoint that can complete no more ops, because
	// ops to a peer that died are still in flight on it.
	ErrBlocked = errors.New("endpoint blocked")
	// ErrRouteReplaced: wrapped beside ErrBlocked when the blocked
	// endpoint is one that the manager's next request does not use (an
	// Outgoing shm endpoint, libfabric 2.x): a new one takes over, so the
	// same request made again may succeed. Its text is the fix the error
	// gives.
	ErrRouteReplaced = errors.New("this manager's next request goes out on a new shm endpoint")
	// ErrBadHandle: a handle that does not decode, or names an address no
	// provider could take.
	ErrBadHandle = errors.New("invalid buffer handle")
)
