package mr

import "unsafe"

// Addr is the address of b's first byte, as registrations, remote
// iovecs and peers name memory: a number, never a pointer the Go runtime
// follows. b must be off the Go heap (Alloc, Adopt) for the address to
// stay valid; 0 for an empty slice.
func Addr(b []byte) uintptr {
	if len(b) == 0 {
		return 0
	}
	return addrOf(b)
}

// Words64 views b as 64-bit words, for memory other processes read and
// write word by word (with sync/atomic). b must be 8-byte aligned — page
// memory from Alloc is — and its length a multiple of 8; otherwise it
// panics, since a misaligned atomic word is a bug in the caller.
func Words64(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	if addrOf(b)%8 != 0 || len(b)%8 != 0 {
		panic("mr.Words64: memory not 8-byte aligned or not a whole number of words")
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}
