package libfabric

import (
	"bytes"
	"encoding/binary"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/proc"
)

// A removed peer's handshake, left in its slot (libfabric 1.x's shm).
//
// An shm peer answers this endpoint's first command by writing, into this
// endpoint's own region, the slot this endpoint has in the peer's map
// (smr_progress_connreq); every later op to whatever name holds that
// slot trusts it and sends no name again (smr_verify_peer). Removing the
// peer clears neither (smr_av_remove, smr_unmap_from_endpoint, v1.17.0),
// and 1.x's map hands the freed slot to the next insert when it was the
// last one taken. The next peer then receives commands that name a slot
// of its map meant for someone else: an empty one crashes it inside
// fi_cq_read (a manager meeting owners in turn with CMA off, which the
// ops then need); one that holds a third process has the peer copy into
// that process's region. With CMA shm copies by itself and sends no
// command, which is why it showed only without. So on 1.x, when fitransfer
// removes an shm peer, it clears the slot's handshake in its own region,
// as the peer's first answer would have set it.
//
// The region's layout is shm's shared-memory format as libfabric 1.17
// lays it out (SMR_VERSION 4, include/ofi_shm.h; 1.18 keeps the version
// number with a shorter header, which the checks of its fields and of
// this endpoint's own name there refuse). A region of another layout, or
// of a debug build, is left alone, and its endpoint never removes a peer
// whose region it mapped (removePeer).

// Offsets in shm's region header and peer data, libfabric 1.17.
const (
	smrVersion4        = 4
	smrFlagDebug       = 1 << 1
	smrHdrFlags        = 2
	smrHdrPID          = 4
	smrHdrTotalSize    = 40
	smrHdrPeerDataOff  = 96
	smrHdrNameOff      = 104
	smrHdrSize         = 120
	smrMaxPeers        = 256
	smrNameMax         = 256
	smrPeerDataSize    = 272 // struct smr_peer_data: addr.name, addr.id, sar_status, name_sent
	smrPeerDataID      = 256
	smrPeerDataNameSnt = 268
)

// ownRegion is this endpoint's own shm region, mapped once to clear the
// handshakes of removed peers; nil mem when its format is not known.
type ownRegion struct {
	mem      []byte
	peerData int
	tried    bool
	// later: removed peers that keep their slot until they can no
	// longer write here (sweepRemovals).
	later    map[string]bool
	sweeping bool // sweepLater is armed
}

// clearsHandshakes reports whether removing a peer from this endpoint
// leaves a handshake behind that fitransfer must clear: shm on 1.x.
func (r *Route) clearsHandshakes() bool {
	return r.Provider == fabric.BackendSHM && fabric.RuntimeVersion().Major() < 2
}

// region maps this endpoint's region the first time it is asked, and
// returns it, or nil when its format is not the one known here. Runs on
// the loop (inside Do), as the removals do.
func (r *Route) region() *ownRegion {
	o := &r.own
	if o.tried {
		if o.mem == nil {
			return nil
		}
		return o
	}
	o.tried = true
	s, ok := shmRegionName(r.name)
	if !ok {
		return nil
	}
	f, err := os.OpenFile("/dev/shm/"+s, os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() || fi.Size() < smrHdrSize || fi.Size() > 1<<34 {
		return nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil
	}
	if pd, ok := regionLayout(mem, s); ok {
		o.mem, o.peerData = mem, pd
		return o
	}
	_ = unix.Munmap(mem)
	return nil
}

// regionLayout checks that mem is a release build's SMR_VERSION 4
// region of this process named name, and returns where its peer data
// starts.
func regionLayout(mem []byte, name string) (peerData int, ok bool) {
	le := binary.LittleEndian
	if mem[0] != smrVersion4 || le.Uint16(mem[smrHdrFlags:])&smrFlagDebug != 0 ||
		int32(le.Uint32(mem[smrHdrPID:])) != int32(os.Getpid()) || le.Uint64(mem[smrHdrTotalSize:]) != uint64(len(mem)) {
		return 0, false
	}
	pd, no := le.Uint64(mem[smrHdrPeerDataOff:]), le.Uint64(mem[smrHdrNameOff:])
	end := pd + smrMaxPeers*smrPeerDataSize
	if pd%8 != 0 || pd < smrHdrSize || end < pd || end > no || no >= uint64(len(mem)) || uint64(len(mem))-no < uint64(len(name))+1 {
		return 0, false
	}
	if string(mem[no:no+uint64(len(name))]) != name || mem[no+uint64(len(name))] != 0 {
		return 0, false
	}
	return int(pd), true
}

// slotOf returns the slot whose peer data names name (shm copies a
// peer's name there when it inserts it), or -1.
func (o *ownRegion) slotOf(name []byte) int {
	want := []byte(shmText(name))
	if len(want) == 0 || len(want) >= smrNameMax {
		return -1
	}
	for i := 0; i < smrMaxPeers; i++ {
		e := o.mem[o.peerData+i*smrPeerDataSize:]
		if bytes.Equal(e[:len(want)], want) && e[len(want)] == 0 {
			return i
		}
	}
	return -1
}

// clearHandshake forgets, in slot i, the peer's answer and that this
// endpoint's name was sent, as before the slot's first peer.
func (o *ownRegion) clearHandshake(i int) {
	e := o.peerData + i*smrPeerDataSize
	atomic.StoreInt64((*int64)(unsafe.Pointer(&o.mem[e+smrPeerDataID])), -1)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&o.mem[e+smrPeerDataNameSnt])), 0)
}

// unmap releases the mapping; at the endpoint's close.
func (o *ownRegion) unmap() {
	if o.mem != nil {
		_ = unix.Munmap(o.mem)
		o.mem = nil
	}
}

// removePeer removes name from the endpoint's address vector, clearing
// the handshake it leaves on 1.x's shm. A 1.x shm endpoint whose region
// has another layout keeps every peer whose region it mapped instead:
// its map then fills after 256 of its inserts, and further ones fail
// with an error rather than crash a later peer. On the loop, inside Do.
//
// A peer that may still write into this endpoint's region keeps its slot
// until it cannot (sweepRemovals): it answers a name this endpoint sent
// it by writing the handshake, and sends commands that name its slot
// here, whenever its own progress gets to them, and either, after the
// clear, would hand the next peer of the slot a stale handshake or have
// this endpoint follow a region it unmapped. fitransfer forgets an owner
// when its verifier's connection ends, which an owner's Close does
// before its shm endpoint stops.
func (r *Route) removePeer(name []byte) {
	if !r.clearsHandshakes() {
		r.loop.Endpoint().ForgetPeer(name)
		return
	}
	o := r.region()
	if o == nil {
		return // kept: see above
	}
	if shmPeerMayWrite(name) {
		if o.later == nil {
			o.later = map[string]bool{}
		}
		o.later[string(name)] = true
		if !o.sweeping {
			o.sweeping = true
			r.sweepLater(sweepFirst)
		}
		return
	}
	r.removeNow(o, name)
}

// sweepFirst and sweepMax bound the pauses between sweeps of the peers
// removePeer kept: a closing peer's file goes within milliseconds, and a
// peer that keeps its endpoint open is looked at once a second.
const (
	sweepFirst = 20 * time.Millisecond
	sweepMax   = time.Second
)

// sweepLater sweeps the kept peers after pause, and again, each pause
// twice the last up to sweepMax, while some are kept; until the loop
// stops. The sweep before an insert may come first.
func (r *Route) sweepLater(pause time.Duration) {
	time.AfterFunc(pause, func() {
		again := false
		if err := r.loop.Do(func() {
			r.sweepRemovals(nil)
			o := &r.own
			if again = len(o.later) > 0; !again {
				o.sweeping = false
			}
		}); err != nil {
			if r.loop.Closing() || r.loop.Stopped() {
				return // the endpoint's close unmaps every region
			}
			again = true // a call held the endpoint past its wedge: later
		}
		if again {
			r.sweepLater(min(2*pause, sweepMax))
		}
	})
}

// removeNow removes name and clears the handshake its slot keeps.
func (r *Route) removeNow(o *ownRegion, name []byte) {
	slot := o.slotOf(name)
	r.loop.Endpoint().ForgetPeer(name)
	if slot >= 0 {
		o.clearHandshake(slot)
		r.cleared.Add(1)
	}
}

// sweepRemovals removes the peers removePeer kept that can no longer
// write here: before each insert (PeerBy), which may take a freed slot,
// and from sweepLater. A name about to be inserted again is simply taken
// back. On the loop.
func (r *Route) sweepRemovals(inserting []byte) {
	o := &r.own
	if len(o.later) == 0 {
		return
	}
	delete(o.later, string(inserting)) // still inserted: Peer finds it
	for name := range o.later {
		if !shmPeerMayWrite([]byte(name)) {
			delete(o.later, name)
			r.removeNow(o, []byte(name))
		}
	}
}

// shmPeerMayWrite reports whether the shm endpoint name may still run
// its progress: its region file is there and its process has not exited.
// shm unlinks the file when the endpoint closes; a killed process's file
// stays until a manager of its user removes it.
func shmPeerMayWrite(name []byte) bool {
	if !shmRegionExists(name) {
		return false
	}
	gone, _ := proc.Gone(ShmPeerPID(name))
	return !gone
}

// HandshakesCleared is how many removed peers' handshakes this endpoint
// cleared (removePeer), for tests.
func (r *Route) HandshakesCleared() int64 { return r.cleared.Load() }
