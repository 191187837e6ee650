package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/fitransfer/fitransfer/internal/route"
	"github.com/fitransfer/fitransfer/progress"
)

// OtherShmAddress is a copy of h whose shm endpoint names another
// endpoint of its owner than the one the owner told when it was verified,
// as a handle the owner issued after replacing its shm endpoint would
// (or a forged one): a manager that routes it verifies the owner again
// (Manager.reverify), at most once per owner every reverifyAfter.
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

// RedoAfterClose runs, for a read of h into local, what a request runs
// when its copy found the mem link ended, but with m closed in between:
// it prepares the op as the request does, ends the link as a verification
// of the owner again does (EvictVerifiedOwners), closes m, and then runs
// the redo. It returns the redo's error and how many owners m holds
// verified afterwards.
func RedoAfterClose(m *Manager, local *Buffer, h RemoteBuffer) (redoErr error, verified int, err error) {
	ctx := context.Background()
	ops := [1]opSpec{{op: progress.Read, local: view{local.st, local.off, h.Len()}, remote: h}}
	times := reqTimes{ctx: ctx, timeout: m.cfg.timeout}
	if err := m.acquire(); err != nil {
		return nil, 0, err
	}
	err = m.prepare(ctx, &times, ops[:])
	m.releaseManager()
	defer releaseOps(ops[:])
	o := &ops[0]
	if err != nil {
		return nil, 0, err
	}
	if o.kind != route.Mem {
		return nil, 0, fmt.Errorf("the read routes over %v, not mem", o.kind)
	}
	o.mm.unref() // as runMem after its copy
	o.mm = nil
	EvictVerifiedOwners(m)
	for deadline := time.Now().Add(10 * time.Second); !o.link.done.Load(); {
		if time.Now().After(deadline) {
			return nil, 0, errors.New("the mem link did not end within 10s of the eviction")
		}
		runtime.Gosched()
	}
	if err := m.Close(); err != nil {
		return nil, 0, err
	}
	redoErr = m.redoMem(route.Limit{Ctx: ctx}, o, &memLinkEnded{pid: o.peer.pid})
	m.verified.mu.Lock()
	defer m.verified.mu.Unlock()
	for _, v := range m.verified.byID {
		if settled(v) && v.peer != nil {
			verified++
		}
	}
	return redoErr, verified, nil
}

// VerificationsUnderWay counts m's verifications of owners that have not
// ended.
func VerificationsUnderWay(m *Manager) int {
	p := &m.verified
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, v := range p.byID {
		if !settled(v) {
			n++
		}
	}
	return n
}

// VerificationsRun counts the verifications of owners m has run.
func VerificationsRun(m *Manager) uint64 { return m.verified.runs.Load() }
