package mr

import (
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
)

// Access is what peers may do with a registered buffer. The owner's own
// transfers (reading into it, writing from it) are always allowed.
type Access uint8

const (
	// RemoteRead lets peers read the buffer.
	RemoteRead Access = 1 << iota
	// RemoteWrite lets peers write the buffer.
	RemoteWrite
)

// ReadWrite lets peers read and write.
const ReadWrite = RemoteRead | RemoteWrite

func (a Access) String() string {
	var parts []string
	if a&RemoteRead != 0 {
		parts = append(parts, "remote-read")
	}
	if a&RemoteWrite != 0 {
		parts = append(parts, "remote-write")
	}
	if len(parts) == 0 {
		return "local-only"
	}
	return strings.Join(parts, "|")
}

// Allows reports whether every right in want is granted.
func (a Access) Allows(want Access) bool { return a&want == want }

// Bits is the fi_mr_attr.access value: local read/write plus the remote
// rights.
func (a Access) Bits() uint64 {
	bits := fabric.AccessRead | fabric.AccessWrite
	if a&RemoteRead != 0 {
		bits |= fabric.AccessRemoteRead
	}
	if a&RemoteWrite != 0 {
		bits |= fabric.AccessRemoteWrite
	}
	return bits
}
