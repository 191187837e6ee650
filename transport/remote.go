package transport

import (
	"fmt"
	"net"
	"sync/atomic"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/internal/route/mem"
	"github.com/fitransfer/fitransfer/mr"
)

// RemoteBuffer is a handle to a peer's registered buffer, or to a slice of
// it: what a peer needs to read or write it with RMA. It carries, per
// backend the owner has, the provider, the owner endpoint's name, the
// memory key and the remote address of the buffer; plus the owner's node
// and manager identity, the length and the access the owner granted.
//
// Send it to peers with MarshalBinary or MarshalJSON (docs/handle.md); it
// is a value and safe to copy.
type RemoteBuffer struct {
	node   ID
	owner  ID
	id     uint64 // buffer id within the owner
	off    uint64 // start of this view within the registration
	n      uint64
	size   uint64 // length of the whole registration
	access mr.Access
	eps    []remoteEP
}

type remoteEP struct {
	provider string
	rail     uint8  // which of the owner's rails (domains) of provider
	name     []byte // owner endpoint name (fi_getname)
	key      uint64
	base     uint64    // remote address of byte 0 of the registration
	guard    *guardRef // shm, cma, mem: where the owner publishes the buffer's state
}

// guardRef locates a buffer's entry in its owner's guard table: what
// shm, cma and mem ops check before they touch the buffer.
type guardRef struct {
	table uint64 // remote address of the table
	key   uint64 // the table's key
	slot  uint32
	gen   uint64
	// memo: on a mem endpoint, the route its last op found, for up to
	// two managers of this process (keepMemo); shared by every copy and
	// slice of the handle, and never sent with it.
	memo [2]atomic.Pointer[memMemo]
}

// Len is the handle's length in bytes.
func (r RemoteBuffer) Len() uint64 { return r.n }

// Access is what the owner allows peers to do.
func (r RemoteBuffer) Access() mr.Access { return r.access }

// Owner identifies the manager that registered the buffer.
func (r RemoteBuffer) Owner() ID { return r.owner }

// Node identifies where the owner runs (see NodeID).
func (r RemoteBuffer) Node() ID { return r.node }

// Providers lists the backends through which the buffer can be reached.
func (r RemoteBuffer) Providers() []string {
	out := make([]string, len(r.eps))
	for i := range r.eps {
		out[i] = r.eps[i].provider
	}
	return out
}

// IsZero reports whether r is the zero value (no buffer).
func (r RemoteBuffer) IsZero() bool { return r.owner == ID{} && len(r.eps) == 0 }

// Slice returns the handle of bytes [off, off+n) of r: a view that still
// carries the whole registration's key (see Buffer.Slice).
func (r RemoteBuffer) Slice(off, n uint64) (RemoteBuffer, error) {
	if off > r.n || n > r.n-off {
		return RemoteBuffer{}, fmt.Errorf("%w: a slice of %d bytes at offset %d of a %d-byte remote buffer", ErrOutOfRange, n, off, r.n)
	}
	s := r
	s.off += off
	s.n = n
	return s, nil
}

// Via returns r with only the endpoints a transfer may take where rt
// goes, rt being the route Manager.Route gave for r (without an error).
// On a same-node route, those are the handle's same-node endpoints (mem,
// cma, shm), each used only toward the process the kernel verified; a
// transfer may need any of them (device memory, or a mem link the owner
// refused, takes cma or shm). On another route, they are the endpoints
// of rt's backend and, where rt names a host (tcp;ofi_rxm), that host's.
// A caller that checked where r's traffic goes (a server that writes only
// to its client, say) transfers with r.Via(rt): should the owner go away
// later, the transfer fails instead of taking another endpoint the handle
// names, which nobody checked. A route within this process (memcpy)
// keeps r as it is.
func (r RemoteBuffer) Via(rt Route) RemoteBuffer {
	if rt.Backend == string(fabric.BackendMemcpy) {
		return r
	}
	sameNode := func(provider string) bool {
		return provider == mem.Name || provider == cma.Name || provider == string(fabric.BackendSHM)
	}
	onNode := sameNode(rt.Backend)
	host := net.ParseIP(rt.Host)
	out := r
	out.eps = nil
	for _, ep := range r.eps {
		if onNode {
			if sameNode(ep.provider) {
				out.eps = append(out.eps, ep)
			}
			continue
		}
		if ep.provider != rt.Backend {
			continue
		}
		if rt.Host != "" {
			hp := libfabric.SockaddrHostPort(ep.name)
			h, _, err := net.SplitHostPort(hp)
			if hp == "" || err != nil || !net.ParseIP(h).Equal(host) {
				continue
			}
		}
		out.eps = append(out.eps, ep)
	}
	return out
}

// railEP is the owner's endpoint on provider's rail, or nil.
func (r RemoteBuffer) railEP(provider string, rail uint8) *remoteEP {
	for i := range r.eps {
		if r.eps[i].provider == provider && r.eps[i].rail == rail {
			return &r.eps[i]
		}
	}
	return nil
}

// rails counts the owner's rails of provider.
func (r RemoteBuffer) rails(provider string) int {
	n := 0
	for i := range r.eps {
		if r.eps[i].provider == provider {
			n++
		}
	}
	return n
}

func (r RemoteBuffer) endpoint(provider string) *remoteEP {
	for i := range r.eps {
		if r.eps[i].provider == provider {
			return &r.eps[i]
		}
	}
	return nil
}

func (r RemoteBuffer) String() string {
	return fmt.Sprintf("remote buffer %d of %s (%d bytes at %d, %s, via %v)", r.id, r.owner, r.n, r.off, r.access, r.Providers())
}
