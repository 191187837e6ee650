package mr

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// This file holds the typed views of memory that other packages need, so
// that unsafe stays in mr and internal/ofi: each helper takes a slice,
// checks what makes its conversion sound, and returns a plain address or
// a typed pointer (the idea of cilium/ebpf's internal/sys pointers).

// Addr returns the address of b's first byte: the number libfabric, the
// kernel (process_vm_readv/writev) and peers use for b. An empty slice
// with capacity gives the address its first byte would have; one without
// (such as b[len(b):] of a full slice) may give any address of its
// array, and nil gives 0.
//
// Computing the address is always safe; it stays meaningful only as long
// as the memory stays where it is. Memory from Alloc or Adopt does until
// Free (or its owner unmaps it); Go heap memory only while b is
// reachable, and it must never be handed to libfabric (CheckOffHeap).
func Addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// Word32 returns the naturally aligned 32-bit word that holds b[off], and
// the shift that brings b[off] to the word's low byte:
//
//	word, shift := mr.Word32(b, off)
//	byte(atomic.LoadUint32(word) >> shift) == b[off]
//
// An atomic load of the word reads b[off] as one access that the compiler
// cannot hoist out of a loop, for watching a byte that a peer's RMA write
// or the kernel changes (Go has no atomic byte load).
//
// The word starts at &b[off] rounded down to a multiple of 4, so up to 3
// of its bytes may lie outside b, before or after it. Reading them is
// sound: memory is mapped in pages, which are multiples of 4 bytes, so
// the word lies in the page that holds b[off]. Only load through the
// word: a store would write those neighbouring bytes too. It panics when
// off is not an index of b.
func Word32(b []byte, off int) (word *uint32, shift uint) {
	if off < 0 || off >= len(b) {
		panic(fmt.Sprintf("mr.Word32: offset %d outside a %d-byte slice", off, len(b)))
	}
	p := unsafe.Pointer(&b[off])
	mis := uintptr(p) & 3
	word = (*uint32)(unsafe.Add(p, -int(mis)))
	if littleEndian {
		return word, uint(8 * mis)
	}
	return word, uint(8 * (3 - mis))
}

// Uint64 returns b[off:off+8] as a *uint64, for atomic access to a 64-bit
// word kept in registered memory (a peer's RMA or the kernel reads or
// writes it as 8 bytes). The word's bytes are in the machine's byte
// order. It panics unless the 8 bytes lie in b and start at an address
// that is a multiple of 8 (sync/atomic requires it on 32-bit platforms,
// and an unaligned word could be torn by a concurrent copy); memory from
// Alloc is page-aligned, so an offset that is a multiple of 8 is.
func Uint64(b []byte, off int) *uint64 {
	if off < 0 || off > len(b)-8 {
		panic(fmt.Sprintf("mr.Uint64: bytes [%d, %d) outside a %d-byte slice", off, off+8, len(b)))
	}
	p := unsafe.Pointer(&b[off])
	if uintptr(p)&7 != 0 {
		panic(fmt.Sprintf("mr.Uint64: offset %d of a slice at %#x is not 8-byte aligned", off, Addr(b)))
	}
	return (*uint64)(p)
}

// littleEndian is whether the low byte of a word is at its lowest address.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Words64 views b as 64-bit words, for memory other processes read and
// write word by word (with sync/atomic). b must be 8-byte aligned — page
// memory from Alloc is — and its length a multiple of 8; otherwise it
// panics, since a misaligned atomic word is a bug in the caller.
func Words64(b []byte) []uint64 {
	if len(b) == 0 {
		return nil
	}
	if Addr(b)%8 != 0 || len(b)%8 != 0 {
		panic("mr.Words64: memory not 8-byte aligned or not a whole number of words")
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// Words32 views b, 4-byte aligned and a multiple of 4 bytes long, as
// 32-bit words (for atomic counters in shared memory).
func Words32(b []byte) []uint32 {
	if len(b) == 0 || Addr(b)%4 != 0 || len(b)%4 != 0 {
		panic("mr.Words32: memory not made of aligned 32-bit words")
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
