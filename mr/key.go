package mr

import (
	"crypto/rand"
	"encoding/binary"
)

// RandomKey returns a random memory key that fits in keySize bytes (the
// domain's mr_key_size; 8 and more give 64 random bits). Keys are never 0
// and never all ones (FI_KEY_NOTAVAIL), so a peer cannot guess another
// buffer's key from its own, as it could with a counter.
func RandomKey(keySize uint64) uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		k := binary.LittleEndian.Uint64(b[:])
		if keySize > 0 && keySize < 8 {
			k &= 1<<(8*keySize) - 1
		}
		if k != 0 && k != ^uint64(0) {
			return k
		}
	}
}

// RemoteAddr is the address a peer puts in an RMA op for byte off of a
// registered buffer at base: the virtual address when the domain has
// FI_MR_VIRT_ADDR, else the offset from the start of the registration.
// Mixing them up is a silent success on tcp;ofi_rxm (it reads the wrong
// bytes), so every handle carries the result of this rule.
func RemoteAddr(virtAddr bool, base uintptr, off uint64) uint64 {
	if virtAddr {
		return uint64(base) + off
	}
	return off
}
