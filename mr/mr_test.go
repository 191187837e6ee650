package mr

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestAllocFree(t *testing.T) {
	b, err := Alloc(10000)
	require.NoError(t, err)
	assert.Len(t, b, 10000)
	assert.Zero(t, uintptr(unsafe.Pointer(&b[0]))%uintptr(unix.Getpagesize()), "page aligned")
	assert.NoError(t, CheckOffHeap(b))
	assert.NoError(t, CheckOffHeap(b[100:200]), "a slice of Alloc'd memory is off-heap too")
	assert.Error(t, Free(b[100:]), "only what Alloc returned can be freed")
	require.NoError(t, Free(b))
	assert.ErrorIs(t, CheckOffHeap(b), ErrNotOffHeap, "freed memory is unknown")
	assert.Error(t, Free(b), "double free is refused")
	_, err = Alloc(0)
	assert.Error(t, err)
}

// TestFreeRefusesWhatItMustNotFree: a sub-slice of an allocation (which
// Free used to take for the whole of it when it began at its start), and
// memory a registration holds (which a peer could still write into the
// next allocation at that address) are refused, saying why; a hold ends
// once, whatever part of the allocation it was taken on.
func TestFreeRefusesWhatItMustNotFree(t *testing.T) {
	b, err := Alloc(8192)
	require.NoError(t, err)
	assert.ErrorContains(t, Free(b[:100]), "part of an allocation of 8192 bytes", "a prefix")
	assert.ErrorContains(t, Free(b[4096:]), "part of an allocation of 8192 bytes")
	release := Hold(b[100:200])
	second := Hold(b)
	assert.ErrorContains(t, Free(b), "still registered (2 registration(s))")
	release()
	release() // once
	assert.ErrorContains(t, Free(b), "still registered (1 registration(s))")
	second()
	require.NoError(t, Free(b))
	assert.NotPanics(t, func() { Hold(make([]byte, 8))() }, "memory neither declared: nothing held")
}

func TestGoHeapIsRefused(t *testing.T) {
	heap := make([]byte, 4096)
	err := CheckOffHeap(heap)
	assert.True(t, errors.Is(err, ErrNotOffHeap))
	assert.Contains(t, err.Error(), "mr.Alloc")
	assert.Error(t, CheckOffHeap(nil))

	// Memory straddling the end of an allocation is refused too.
	b, err := Alloc(4096)
	require.NoError(t, err)
	defer Free(b)
	over := unsafe.Slice(&b[0], 8192)
	assert.ErrorIs(t, CheckOffHeap(over), ErrNotOffHeap)
}

func TestAdopt(t *testing.T) {
	m, err := unix.Mmap(-1, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(m)
	assert.ErrorIs(t, CheckOffHeap(m), ErrNotOffHeap)
	require.NoError(t, Adopt(m))
	assert.NoError(t, CheckOffHeap(m[10:20]))
	assert.Error(t, Adopt(m[100:200]), "overlapping adoption is refused")
	assert.Error(t, Free(m), "adopted memory is not Free'd by mr")
	Forget(m)
	assert.ErrorIs(t, CheckOffHeap(m), ErrNotOffHeap)
}

func TestRandomKeys(t *testing.T) {
	seen := map[uint64]bool{}
	var prev uint64
	sequential := 0
	for i := 0; i < 10000; i++ {
		k := RandomKey(8)
		require.False(t, seen[k], "repeated key")
		seen[k] = true
		if k == prev+1 {
			sequential++
		}
		prev = k
		assert.NotZero(t, k)
	}
	assert.Zero(t, sequential)
	for i := 0; i < 1000; i++ {
		k := RandomKey(2)
		assert.Less(t, k, uint64(1<<16))
		assert.NotZero(t, k)
	}
}

func TestRemoteAddr(t *testing.T) {
	assert.Equal(t, uint64(0x1000+5), RemoteAddr(true, 0x1000, 5))
	assert.Equal(t, uint64(5), RemoteAddr(false, 0x1000, 5))
}

func TestAccess(t *testing.T) {
	assert.Equal(t, "remote-read|remote-write", ReadWrite.String())
	assert.Equal(t, "local-only", Access(0).String())
	assert.True(t, ReadWrite.Allows(RemoteRead))
	assert.False(t, RemoteRead.Allows(RemoteWrite))
	assert.Equal(t, uint64(1<<8|1<<9|1<<12), RemoteRead.Bits())
}

func TestAddr(t *testing.T) {
	b, err := Alloc(4096)
	require.NoError(t, err)
	defer Free(b)
	assert.Equal(t, uintptr(unsafe.Pointer(&b[0])), Addr(b))
	assert.Zero(t, Addr(b)%uintptr(unix.Getpagesize()), "Alloc'd memory starts a page")
	assert.Equal(t, Addr(b)+5, Addr(b[5:]))
	assert.Equal(t, Addr(b)+7, Addr(b[7:7]), "an empty slice with capacity: where its first byte would be")
	assert.Zero(t, Addr(nil))
}

func TestWord32(t *testing.T) {
	b, err := Alloc(4096)
	require.NoError(t, err)
	defer Free(b)
	for off := 0; off < 12; off++ {
		word, shift := Word32(b, off)
		assert.Equal(t, (Addr(b)+uintptr(off))&^3, uintptr(unsafe.Pointer(word)), "offset %d: the aligned word holding it", off)
		for _, v := range []byte{0x5a, 0xff, 1} {
			b[off] = v
			assert.Equal(t, v, byte(atomic.LoadUint32(word)>>shift), "offset %d", off)
		}
	}
	// A slice that starts and ends inside a word: the word reaches past
	// both ends, and still sees the slice's byte.
	inner := b[5:6]
	word, shift := Word32(inner, 0)
	assert.Equal(t, Addr(b)+4, uintptr(unsafe.Pointer(word)))
	inner[0] = 0x77
	assert.Equal(t, byte(0x77), byte(atomic.LoadUint32(word)>>shift))

	assert.Panics(t, func() { Word32(b, -1) })
	assert.Panics(t, func() { Word32(b, len(b)) })
	assert.Panics(t, func() { Word32(nil, 0) })
}

func TestUint64(t *testing.T) {
	b, err := Alloc(4096)
	require.NoError(t, err)
	defer Free(b)
	p := Uint64(b, 8)
	assert.Equal(t, Addr(b)+8, uintptr(unsafe.Pointer(p)))
	atomic.StoreUint64(p, 0x0102030405060708)
	assert.Equal(t, uint64(0x0102030405060708), binary.NativeEndian.Uint64(b[8:16]), "the word is b[8:16]")
	assert.Zero(t, binary.NativeEndian.Uint64(b[0:8]))
	assert.Zero(t, binary.NativeEndian.Uint64(b[16:24]))
	assert.NotPanics(t, func() { Uint64(b, 4088) }, "the last word")

	assert.Panics(t, func() { Uint64(b, 4) }, "not 8-byte aligned")
	assert.Panics(t, func() { Uint64(b[1:], 8) }, "aligned offset, unaligned address")
	assert.Panics(t, func() { Uint64(b, 4090) }, "past the end")
	assert.Panics(t, func() { Uint64(b, -8) })
	assert.Panics(t, func() { Uint64(b[:4], 0) }, "shorter than a word")
}

func TestWords64(t *testing.T) {
	mem, err := Alloc(4096)
	require.NoError(t, err)
	defer Free(mem)
	w := Words64(mem[8:24])
	require.Len(t, w, 2)
	w[1] = 0x0102030405060708
	assert.Equal(t, byte(0x08), mem[16], "word 1 of mem[8:] is bytes 16..23, little-endian")
	assert.Panics(t, func() { Words64(mem[1:9]) }, "misaligned")
	assert.Panics(t, func() { Words64(mem[:12]) }, "not whole words")
}
