package transport

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"sync"
)

// ID identifies a node or a manager in handles.
type ID [16]byte

func (id ID) String() string { return hex.EncodeToString(id[:]) }

func newManagerID() ID {
	var id ID
	_, _ = rand.Read(id[:])
	return id
}

var thisNode struct {
	once sync.Once
	id   ID
}

// NodeID identifies the scope in which the shm provider can reach another
// process: the same boot of the same kernel (boot_id), the same pid
// namespace (CMA addresses processes by pid) and the same mount namespace
// (shm's regions live in /dev/shm). Processes started with `ip netns exec`
// get their own mount namespace and so count as another node.
func NodeID() ID {
	thisNode.once.Do(func() {
		h := sha256.New()
		for _, part := range []string{
			readTrimmed("/proc/sys/kernel/random/boot_id"),
			readLink("/proc/self/ns/pid"),
			readLink("/proc/self/ns/mnt"),
		} {
			h.Write([]byte(part))
			h.Write([]byte{0})
		}
		host, _ := os.Hostname()
		h.Write([]byte(host))
		copy(thisNode.id[:], h.Sum(nil))
	})
	return thisNode.id
}

func readTrimmed(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func readLink(path string) string {
	s, _ := os.Readlink(path)
	return s
}
