// Package mr owns the memory fitransfer hands to libfabric: off-heap
// allocation (mmap), the rule that only such memory is registered, access
// rights, memory keys, and the remote address a peer must use.
//
// libfabric keeps the addresses of registered memory and providers write
// into it from outside the Go runtime (DMA, process_vm_writev), so it must
// never be Go heap memory, which the garbage collector may move or free.
// Alloc maps memory outside the Go heap; Adopt declares memory that some
// other allocator owns (mmap, C.malloc, a device allocator).
//
// Addr, Word32 and Uint64 are the typed views of such memory that the
// rest of fitransfer uses (an address for libfabric or the kernel, an
// atomically read byte, an atomic 64-bit word), so that unsafe appears
// only here and in internal/ofi.
package mr
