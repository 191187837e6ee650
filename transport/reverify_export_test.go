package transport

import (
	"bytes"
	"slices"
)

// OtherShmAddress is a copy of h whose shm endpoint names another
// endpoint of its owner than the one the owner told when it was verified,
// as a handle the owner issued after replacing its shm endpoint would
// (or a forged one): a manager that routes it verifies the owner again
// (Manager.reverify), at most once per verification every reverifyAfter.
// It is a handle as received: it remembers no route (memo), so its op
// routes it.
func OtherShmAddress(h RemoteBuffer) (RemoteBuffer, error) {
	b, err := h.MarshalBinary()
	if err != nil {
		return RemoteBuffer{}, err
	}
	h = RemoteBuffer{}
	if err := h.UnmarshalBinary(b); err != nil {
		return RemoteBuffer{}, err
	}
	for i := range h.eps {
		ep := &h.eps[i]
		if ep.provider != "shm" {
			continue
		}
		name := slices.Clone(ep.name)
		if s := bytes.TrimRight(name, "\x00"); len(s) < len(name) {
			name[len(s)] = '7' // "fi_shm://PID:UID:INDEX" with another index
		} else {
			name[len(name)-1] ^= 1
		}
		ep.name = name
	}
	return h, nil
}

// EvictVerifiedOwners makes m evict from its table of verified owners the
// ones it verified (peers.evict): it fills the table with verifications
// under way, which evict passes by, and names one owner more; then it
// takes the placeholders out again.
func EvictVerifiedOwners(m *Manager) {
	p := &m.verified
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.byID == nil {
		p.byID = map[ID]*verification{}
	}
	var fillers []ID
	for len(p.byID) < maxVerified {
		id := newManagerID()
		p.byID[id] = &verification{} // under way: not settled
		fillers = append(fillers, id)
	}
	extra := newManagerID()
	p.entry(extra)
	for _, id := range append(fillers, extra) {
		delete(p.byID, id)
	}
}

// VerifiedMemLink reports on the mem link of m's current verification of
// h's owner: ended says whether that link has ended since; ok is false
// when m has no verification of the owner with a link.
func VerifiedMemLink(m *Manager, h RemoteBuffer) (ended func() bool, ok bool) {
	m.verified.mu.Lock()
	v := m.verified.byID[h.owner]
	m.verified.mu.Unlock()
	if v == nil || !settled(v) || v.peer == nil {
		return nil, false
	}
	v.peer.memMu.Lock()
	l := v.peer.link
	v.peer.memMu.Unlock()
	if l == nil {
		return nil, false
	}
	return l.done.Load, true
}
