package transport

import (
	"github.com/fitransfer/fitransfer/internal/route/cma"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/ofi"
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
// keep FI_DELIVERY_COMPLETE.

var cmaSetting struct {
	once sync.Once
	ok   bool
}

// shmSingleCopyAllowed reports whether this process's settings let shm
// take its single-copy path the same way fitransfer's own check does.
func shmSingleCopyAllowed() bool {
	cmaSetting.once.Do(func() {
		scope := cma.PtraceScope()
		cmaSetting.ok = ofi.RuntimeVersion().Major() == 1 &&
			!fabric.EnvTruthy("FI_SHM_DISABLE_CMA") && (scope == "" || scope == "0")
	})
	return cmaSetting.ok
}

// shmPeerPID is the process id in an shm endpoint name
// ("fi_shm://PID:UID:INDEX"), or 0.
func shmPeerPID(name []byte) int {
	s := strings.TrimRight(string(name), "\x00")
	rest, ok := strings.CutPrefix(s, "fi_shm://")
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

// cmaReaches reports whether process_vm_readv can read addr in process
// pid: one byte, into a local byte.
func cmaReaches(pid int, addr uint64) bool {
	if pid == os.Getpid() {
		return true
	}
	var b [1]byte
	n, err := unix.ProcessVMReadv(pid,
		[]unix.Iovec{{Base: &b[0], Len: 1}},
		[]unix.RemoteIovec{{Base: uintptr(addr), Len: 1}}, 0)
	return err == nil && n == 1
}

// writeFlags is the completion flag for a write over b; peer is the
// verified owner on shm: see the comment at the top of this file.
func (m *Manager) writeFlags(b *backend, peer *sameNodePeer) uint64 {
	switch {
	case m.cfg.transmitComplete:
		return uint64(ofi.OpTransmitComplete)
	case b.provider != fabric.BackendSHM || peer == nil || !shmSingleCopyAllowed():
		return uint64(ofi.OpDeliveryComplete)
	}
	if m.reach.Reaches(peer.pid, peer.cma.table) {
		return uint64(ofi.OpTransmitComplete)
	}
	return uint64(ofi.OpDeliveryComplete)
}
