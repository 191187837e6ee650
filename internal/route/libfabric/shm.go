package libfabric

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/proc"
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"github.com/fitransfer/fitransfer/progress"
)

// Writes over shm and the completion level.
//
// FI_DELIVERY_COMPLETE routes every shm write through the target's
// progress (prov/shm/src/smr_rma.c: a write with that flag never takes the
// single-copy path), so each one waits for the owner to poll. Without it,
// libfabric 1.x's shm copies with process_vm_writev from the initiator
// when CMA works between the two processes, and reports the completion
// after the copy: the bytes are already in the target's memory. So when
// fitransfer has checked that process_vm_readv reaches the peer — and
// nothing makes shm's own check differ (FI_SHM_DISABLE_CMA, a yama
// ptrace_scope that allows only descendants) — it asks for
// FI_TRANSMIT_COMPLETE and still delivers what WriteFrom promises. For any
// other peer, and on libfabric 2.x whose shm it has not verified, writes
// keep FI_DELIVERY_COMPLETE, unless the caller asked for less
// (WithTransmitComplete; Action.InjectComplete for writes of at most
// ShmInlineMax on 2.0 to 2.6, ShmOwnerCopies and completion.go).

var cmaSetting struct {
	once sync.Once
	ok   bool
}

// shmSingleCopyAllowed reports whether this process's settings let shm
// take its single-copy path the same way fitransfer's own check does.
func shmSingleCopyAllowed() bool {
	cmaSetting.once.Do(func() {
		scope := cma.PtraceScope()
		cmaSetting.ok = fabric.RuntimeVersion().Major() == 1 &&
			!fabric.EnvTruthy("FI_SHM_DISABLE_CMA") && (scope == "" || scope == "0")
	})
	return cmaSetting.ok
}

// ShmInlineMax is the most bytes a write of host memory over libfabric
// 2.x's shm carries inside its command when it does not ask for delivery
// completion (SMR_MSG_DATA_LEN, prov/shm/src/smr_util.h: 192 in 2.0 to
// 2.4, 320 in 2.5, 200 in 2.6). The owner's provider copies such a write
// in the same call of its progress that looks up the key
// (smr_progress_cmd_rma), and fitransfer runs that progress and closes a
// registration under the same drive lock, so once the owner's Close has
// closed the registration the write cannot land; it completes when
// posted. A larger one goes through an inject buffer, whose slot 2.0 to
// 2.4 do not give back when the owner refuses the key, or over several
// rounds (SAR).
const ShmInlineMax = 192

// ShmOwnerCopies reports whether the owner's provider copies every write
// that an shm endpoint of in posts, checking its key: libfabric 2.0 to
// 2.6 (the versions whose shm was read for ShmInlineMax), with shm's
// fast RMA off (fabric.WithoutShmFastRMA, as transport and the floor
// open shm on 2.x; shm keeps the read-after-read order only then). With
// fast RMA the initiator copies a write that does not ask for delivery
// completion itself, with no key check.
func ShmOwnerCopies(in *fabric.Info) bool {
	return shmReadVersion() && fabric.ShmFastRMAOff(in)
}

// shmReadVersion: the runtime libfabric is 2.0 to 2.6.
var shmReadVersion = sync.OnceValue(func() bool {
	v := fabric.RuntimeVersion()
	return v.Major() == 2 && v.Minor() <= 6
})

// SingleCopy reports whether this process's shm copies RMA ops itself
// with process_vm_readv/writev toward a peer that process_vm_readv
// reaches (libfabric 1.x's single-copy path, see above), the owner not
// involved: then reading a few bytes of the owner with process_vm_readv
// is what shm would do for them.
func SingleCopy() bool { return shmSingleCopyAllowed() }

// shmRegionExists reports whether the shared memory file of the shm
// endpoint named name ("fi_shm://PID:UID:INDEX"; shm's smr_no_prefix and
// SMR_DIR) exists: a regular file of this user. Looked at before the name
// is inserted, and again right after: 1.x's shm maps a peer's region when
// it inserts it and, with the file gone, still reports success with no
// region (smr_map_add, prov/util/src/util_shm.c, v1.17.0). An op toward
// that peer then follows a nil region whenever the slot it got last held
// a peer that had answered (smr_verify_peer trusts the slot's old
// handshake), which a peer forgotten when its owner closed, and inserted
// again, met; and the removal of such an insert keeps its name in shm's
// map, where it takes the slot's next peer's name. 2.x maps at the first
// op and fails it while the file is missing. A name with anything but
// digits and colons after its prefix is refused.
func shmRegionExists(name []byte) bool {
	s, ok := shmRegionName(name)
	if !ok {
		return false
	}
	fi, err := os.Lstat("/dev/shm/" + s)
	if err != nil || !fi.Mode().IsRegular() {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}

// ShmMismatch says why this shm endpoint must not talk to the shm
// endpoint named peer: their regions' formats differ (the version byte
// that starts each region, SMR_VERSION: 4 on libfabric 1.17, 8 on 2.0 to
// 2.3). shm lays its shared memory out differently in each, checks no
// peer's, and a process of one libfabric reading a region of another
// crashed inside it (a new user's review: a 2.1 client of a 1.17 serve,
// SIGSEGV in its first post; a 1.17 client of a 2.1 serve, SIGSEGV, or
// a guard entry read back as other bytes). "" when they match; known is
// false when either region cannot be read (an op then finds the peer
// gone, or the next look reads it).
func (r *Route) ShmMismatch(peer []byte) (why string, known bool) {
	own, ok := shmRegionFormat(r.name)
	if !ok {
		return "", false
	}
	theirs, ok := shmRegionFormat(peer)
	if !ok {
		return "", false
	}
	if theirs == own {
		return "", true
	}
	return fmt.Sprintf("libfabric's shm here lays out its shared memory in format %d, and the owner's shm endpoint %s in format %d: "+
		"shm between different libfabric versions crashes; build both sides against one libfabric, or reach the owner over another route",
		own, shmText(peer), theirs), true
}

// shmRegionName is the name under /dev/shm of the region of the shm
// endpoint name ("fi_shm://PID:UID:INDEX": "PID:UID:INDEX"; shm's
// smr_no_prefix); false for a name with anything but digits and colons
// after its prefix.
func shmRegionName(name []byte) (string, bool) {
	s, ok := strings.CutPrefix(shmText(name), shmPrefix)
	return s, ok && s != "" && strings.Trim(s, "0123456789:") == ""
}

// shmRegionFormat reads the version byte that starts the region of the
// shm endpoint name: a regular file of this user.
func shmRegionFormat(name []byte) (byte, bool) {
	s, ok := shmRegionName(name)
	if !ok {
		return 0, false
	}
	f, err := os.OpenFile("/dev/shm/"+s, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0, false
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		return 0, false
	}
	var b [1]byte
	if n, err := f.ReadAt(b[:], 0); n != 1 || err != nil {
		return 0, false
	}
	return b[0], true
}

// shmRegionsMapped reports, for each of names (shm endpoint names), whether
// this process maps that endpoint's region (/dev/shm/PID:UID:INDEX, its
// file deleted or not), by /proc/self/maps: what the kernel says this
// process's shm maps hold, whatever peers said.
func shmRegionsMapped(names [][]byte) []bool { return shmRegionsMappedBy(0, names) }

// shmRegionsMappedBy is shmRegionsMapped for process pid (0: this one):
// whether it maps each of names' regions. All false when its maps cannot
// be read.
func shmRegionsMappedBy(pid int, names [][]byte) []bool {
	out := make([]bool, len(names))
	read := proc.ReadMaps
	if pid != 0 {
		// Another process's maps may not come (proc.ReadMapsWithin):
		// "not mapped" then, and the caller's own deadline decides.
		read = func(pid int) ([]proc.Mapping, error) { return proc.ReadMapsWithin(pid, peerMapsBound) }
	}
	maps, err := read(pid)
	if err != nil {
		return out
	}
	mapped := map[string]bool{}
	for _, m := range maps {
		if region, ok := strings.CutPrefix(strings.TrimSuffix(m.Path, " (deleted)"), "/dev/shm/"); ok {
			mapped[region] = true
		}
	}
	for i, name := range names {
		s, ok := strings.CutPrefix(shmText(name), shmPrefix)
		out[i] = ok && s != "" && mapped[s]
	}
	return out
}

// peerMapsBound is how long shmRegionsMappedBy waits for another
// process's maps.
const peerMapsBound = 100 * time.Millisecond

// ShmRegionsGone reports whether the region files of all of names (shm
// endpoint names) are gone: their endpoints closed, or a manager removed
// what a dead process left.
func ShmRegionsGone(names [][]byte) bool {
	for _, name := range names {
		if shmRegionExists(name) {
			return false
		}
	}
	return true
}

// shmRegionGone is PeerBy's error for a peer whose region is gone: a
// *progress.PeerGoneError, as every route's for a peer that is gone. Its
// Op is the zero one: the caller, which knows the op, sets it.
func (r *Route) shmRegionGone(name []byte) error {
	return &progress.PeerGoneError{Provider: string(r.Provider), Peer: r.Addr(name),
		Cause: "its shm endpoint no longer exists: its manager closed it, or its process ended"}
}

// shmNameSpent is PeerBy's error for a name whose region went while it
// was inserted (libfabric 1.x): a new process of that pid cannot be
// reached over this endpoint.
func shmNameSpent(name []byte) error {
	return fmt.Errorf("%w: the shm endpoint %q was gone when this manager last met it, and libfabric 1.x's shm cannot take that name again on this endpoint; reopen the manager to reach a new process by that name",
		errclass.ErrPeerGone, shmText(name))
}

// shmPrefix starts the shm endpoint names fitransfer takes
// ("fi_shm://PID:UID:INDEX").
const shmPrefix = "fi_shm://"

// shmText is an shm endpoint name without its NUL padding.
func shmText(name []byte) string { return strings.TrimRight(string(name), "\x00") }

// ShmNameOf reports whether name is exactly the name of an shm endpoint
// of process pid and of this user: "fi_shm://PID:UID:INDEX", decimal
// fields, and one NUL after them, which libfabric reads the name up to.
// For a name a peer gives of its own endpoint, which fitransfer then
// inserts: a NUL inside it would have libfabric insert another name than
// the one checked.
func ShmNameOf(name []byte, pid int) bool {
	s, ok := strings.CutSuffix(string(name), "\x00")
	if !ok {
		return false
	}
	s, ok = strings.CutPrefix(s, shmPrefix)
	f := strings.Split(s, ":")
	if !ok || len(f) != 3 {
		return false
	}
	for _, d := range f {
		if d == "" || len(d) > 10 || strings.Trim(d, "0123456789") != "" {
			return false
		}
	}
	return f[0] == strconv.Itoa(pid) && f[1] == strconv.Itoa(os.Geteuid())
}

// ShmPeerPID is the process id in an shm endpoint name
// ("fi_shm://PID:UID:INDEX"), or 0.
func ShmPeerPID(name []byte) int {
	rest, ok := strings.CutPrefix(shmText(name), shmPrefix)
	if !ok {
		return 0
	}
	pidStr, _, _ := strings.Cut(rest, ":")
	pid, err := strconv.Atoi(pidStr)
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}

// awaitPeersMapping waits, until deadline, for each live peer that this
// libfabric 1.x shm endpoint posted an op toward (noteSent) to map its
// region, before the endpoint closes and unlinks the region's file. A
// 1.x target maps an initiator's region when it first reads its
// commands; one whose first command from this endpoint was still queued
// then failed to map it, and crashed on that command in its progress
// (smr_progress_iov reads the sender's missing region:
// prov/shm/src/smr_progress.c, v1.17.0; seen when a peer closed its
// manager 1 ms into a 128 MiB write, from a new user's review; a target
// that mapped the region first never crashed). A peer that stays
// stopped past deadline is left to that. CloseWith waits so once its
// loop posts nothing more (progress.Loop.CloseAfter): a command sent
// after the wait would meet the same end. It drives the endpoint's
// progress meanwhile (progress): a peer closing at the same time waits
// likewise for this endpoint to map its region. A peer's shm loop may
// park unless something asks it to poll: a manager closes such an
// endpoint while its connections to the owners it verified are up
// (transport's announceShm).
func (r *Route) awaitPeersMapping(deadline time.Time, progress func() bool) {
	pids := r.sentTo.list()
	self := [][]byte{r.name}
	for len(pids) > 0 && time.Now().Before(deadline) {
		left := pids[:0]
		for _, pid := range pids {
			if gone, _ := proc.Gone(pid); !gone && !shmRegionsMappedBy(pid, self)[0] {
				left = append(left, pid)
			}
		}
		if pids = left; len(pids) > 0 {
			// This endpoint's progress maps the regions of peers whose
			// own close waits for it likewise.
			progress()
			time.Sleep(time.Millisecond)
		}
	}
}

// AwaitsPeersMapping reports whether closing the endpoint waits for the
// peers it sent to to map its region (awaitPeersMapping): a libfabric
// 1.x shm endpoint.
func (r *Route) AwaitsPeersMapping() bool {
	return r.Provider == fabric.BackendSHM && fabric.RuntimeVersion().Major() < 2
}

// noteSent records that a post of an op of this endpoint toward p
// reached shm, once per peer (the jobs' OnPost), for awaitPeersMapping:
// 1.x's shm sends its name to a new peer then, even for a post it
// refuses, before any op goes through. A job the close failed before it
// posted anything sent nothing, and the close does not wait for it.
func (r *Route) noteSent(p *Peer) {
	if !r.AwaitsPeersMapping() {
		return
	}
	pid := ShmPeerPID(p.raw)
	if pid <= 0 || pid == os.Getpid() {
		return
	}
	r.sentTo.note(pid)
}

// pidSet is a set of process ids that forgets gone processes as it
// grows: a long-lived endpoint meets many peers that come and go, and the
// gone ones are nobody to wait for.
type pidSet struct {
	mu      sync.Mutex
	pids    map[int]struct{}
	kept    int  // the size after the last pruning
	pruning bool // a prune runs (prune)
	pruned  sync.WaitGroup
}

// note adds pid. When the set has doubled since its last pruning it has
// the processes that are gone dropped, on a goroutine of their own: note
// runs on the endpoint's progress loop, and each look at a process is a
// file read. A note costs O(1) on average.
func (s *pidSet) note(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pids[pid]; ok {
		return
	}
	if s.pids == nil {
		s.pids = map[int]struct{}{}
	}
	s.pids[pid] = struct{}{}
	if len(s.pids) >= max(prunePIDsFrom, 2*s.kept) && !s.pruning {
		s.pruning = true
		s.kept = len(s.pids) // the next prune when it doubled again, whatever this one finds
		pids := make([]int, 0, len(s.pids))
		for p := range s.pids {
			pids = append(pids, p)
		}
		s.pruned.Add(1)
		go s.prune(pids)
	}
}

// prune drops those of pids that are gone.
func (s *pidSet) prune(pids []int) {
	defer s.pruned.Done()
	gone := pids[:0]
	for _, pid := range pids {
		if g, _ := proc.Gone(pid); g {
			gone = append(gone, pid)
		}
	}
	s.mu.Lock()
	for _, pid := range gone {
		delete(s.pids, pid)
	}
	s.kept = len(s.pids)
	s.pruning = false
	s.mu.Unlock()
}

// list returns the pids.
func (s *pidSet) list() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]int, 0, len(s.pids))
	for pid := range s.pids {
		out = append(out, pid)
	}
	return out
}

// prunePIDsFrom is the size below which a pidSet prunes nothing.
const prunePIDsFrom = 64
