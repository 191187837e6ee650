package transport

import (
	"fmt"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
)

// Address is a manager's endpoint names, one per backend. Hand it to a
// peer's AddPeer when that peer is the target of this manager's transfers
// over a provider that requires the target to know the initiator (efa,
// efa-direct: without it the op fails with an unknown-peer error). shm and
// tcp;ofi_rxm do not need it.
type Address struct {
	Endpoints []AddressEndpoint `json:"endpoints"`
}

// AddressEndpoint is one backend's endpoint name.
type AddressEndpoint struct {
	Provider string `json:"provider"`
	Name     []byte `json:"name"`
}

// Address returns this manager's endpoint names.
func (m *Manager) Address() Address {
	var a Address
	for _, b := range m.backends().all {
		if b.Retired.Load() || b.Outgoing {
			continue
		}
		a.Endpoints = append(a.Endpoints, AddressEndpoint{Provider: b.Name(), Name: append([]byte(nil), b.EndpointName()...)})
	}
	return a
}

// AddPeer inserts a peer's endpoint names into the address vectors of the
// backends they share with this manager, so that the peer can be the
// initiator of transfers with this manager's buffers on every provider.
// Names of providers this manager does not have are ignored, and so are
// addresses of the other IP family than this manager's endpoint of that
// provider (an IPv6 peer of an IPv4 endpoint: neither reaches the
// other), and shm names: shm needs no initiator in the target's address vector, and
// an shm name is a file in /dev/shm that libfabric maps as it is — taken
// from a peer's word, a junk or foreign file would crash this process
// (shm routes insert their owner's name, verified, themselves). It
// returns the providers it inserted into.
func (m *Manager) AddPeer(a Address) ([]string, error) {
	if err := m.acquire(); err != nil {
		return nil, err
	}
	defer m.releaseManager()
	type add struct {
		b    *libfabric.Route
		name []byte
	}
	var adds []add
	for _, ep := range a.Endpoints {
		for _, b := range m.backends().all {
			if b.Name() != ep.Provider || b.Provider == fabric.BackendSHM || b.Retired.Load() || b.OtherFamily(ep.Name) {
				continue
			}
			if err := b.CheckName(ep.Name); err != nil {
				return nil, err // before anything was inserted
			}
			adds = append(adds, add{b, ep.Name})
		}
	}
	var done []string
	for i, ad := range adds {
		p, err := ad.b.Peer(ad.name)
		if err != nil {
			for _, undo := range adds[:i] {
				undo.b.Unadd(undo.name)
			}
			return nil, fmt.Errorf("add peer %s on %s: %w", ad.b.Addr(ad.name), ad.b.Provider, err)
		}
		// Added before the use ends: a Forget still waiting for the
		// peer's last use would otherwise remove it in between.
		ad.b.Add(ad.name)
		p.Done()
		done = append(done, ad.b.Name())
	}
	return done, nil
}

// RemovePeer undoes an AddPeer of the same address: once every AddPeer of
// a name is undone, the peer leaves the address vector (its connection
// or mapping is released) — at once when no op is in flight on that
// endpoint, else when the last one ends. A server calls it when a
// client's session ends.
func (m *Manager) RemovePeer(a Address) {
	if err := m.acquire(); err != nil {
		return
	}
	defer m.releaseManager()
	for _, ep := range a.Endpoints {
		for _, b := range m.backends().all {
			if b.Name() != ep.Provider || b.Provider == fabric.BackendSHM || b.Retired.Load() || b.OtherFamily(ep.Name) {
				continue
			}
			b.Unadd(ep.Name)
		}
	}
}
