// Package route holds what the transport's routes share: their kinds, the
// limit that ends a request's ops besides their completion, and the
// interface each route implements. The routes themselves are packages of
// their own: memcpy (a copy within this process), cma (process_vm_* copies
// by fitransfer to a verified process of this node), and the libfabric
// endpoints (shm, tcp;ofi_rxm, efa: one route whose provider is data).
package route

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fitransfer/fitransfer/progress"
)

// Kind is a route's kind; the transport routes by it, never by a name.
type Kind uint8

// The kinds of route.
const (
	// Memcpy: the owner is a manager of this process; a plain copy.
	Memcpy Kind = iota + 1
	// CMA: the owner is a process of this node the kernel verified;
	// fitransfer copies with process_vm_readv / process_vm_writev.
	CMA
	// Fabric: a libfabric endpoint (shm, tcp;ofi_rxm, efa).
	Fabric
	// Mem: the owner is a process of this node the kernel verified, and
	// it shared the buffer's memfd; a copy between mappings.
	Mem
)

func (k Kind) String() string {
	switch k {
	case Memcpy:
		return "memcpy"
	case CMA:
		return "cma"
	case Fabric:
		return "fabric"
	case Mem:
		return "mem"
	}
	return "none"
}

// Route is one way to the owners of buffers. The copy routes move bytes
// in Run, synchronously; the fabric route posts batches to its progress
// loop and waits for them.
type Route interface {
	Kind() Kind
	// Name is how handles and errors name it: "cma", "memcpy", or the
	// provider.
	Name() string
	// Wedged is a *progress.WedgedError while a call the route made into
	// libfabric has not returned for too long; nil on the copy routes.
	Wedged() error
	// Close releases what the route holds; it reports a wedged endpoint.
	Close() error
}

// Limit is what ends a request besides its completion: its context and
// its deadline (the context's, or the manager's timeout). A zero Deadline
// reads as passed: a request that leaves them unset (copies in one
// piece) must not look at its limit.
type Limit struct {
	Ctx             context.Context
	Start, Deadline time.Time
	// Quit, when closed, ends the request too: its manager is closing.
	Quit <-chan struct{}
}

// Err is progress.ErrClosed once Quit is closed, the context's error, or
// context.DeadlineExceeded once the deadline passed, or nil.
func (l Limit) Err() error {
	select {
	case <-l.Quit:
		return progress.ErrClosed
	default:
	}
	if err := l.Ctx.Err(); err != nil {
		return err
	}
	if !time.Now().Before(l.Deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// Timeout is the error of an op of n bytes that the limit ended after
// done bytes, which moved in chunks of chunk bytes: a
// *progress.TimeoutError, or an error wrapping progress.ErrClosed when
// its manager's closing (Quit) ended it.
func (l Limit) Timeout(op progress.Op, provider, peer string, n, done, chunk uint64, cause error) error {
	if errors.Is(cause, progress.ErrClosed) {
		return fmt.Errorf("%s of %d bytes with %s over %s stopped after %d bytes, its manager closing: %w", op, n, peer, provider, done, cause)
	}
	return &progress.TimeoutError{Op: op, Provider: provider, Peer: peer, Bytes: n,
		After: time.Since(l.Start), Completed: int(done / chunk), Total: int((n + chunk - 1) / chunk),
		Cause: cause}
}

// Piece is how many bytes a copy route moves between two looks at the
// limit: about a millisecond's worth, so that a long copy ends close to
// its deadline, for next to nothing per piece.
const Piece = 4 << 20
