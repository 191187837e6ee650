package libfabric

import (
	"strconv"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
)

// ShmPeerPID is the process id in an shm endpoint name
// ("fi_shm://PID:UID:INDEX"), or 0.
func ShmPeerPID(name []byte) int {
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

// WriteFlags is the completion flag of a write: FI_TRANSMIT_COMPLETE when
// the manager asked for it (transmitComplete), else FI_DELIVERY_COMPLETE.
// On shm a write then always goes through the owner's progress, which
// checks the key (fabric.WithoutShmFastRMA turns off the path where the
// initiator copies alone).
func (r *Route) WriteFlags(transmitComplete bool) uint64 {
	if transmitComplete {
		return uint64(fabric.OpTransmitComplete)
	}
	return uint64(fabric.OpDeliveryComplete)
}
