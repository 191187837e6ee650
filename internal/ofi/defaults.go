package ofi

/*
#include "ofi.h"
*/
import "C"

import (
	"os"
	"sync"
	"sync/atomic"
)

// ShmDisableCMA is the environment variable that turns libfabric's shm
// provider's CMA (process_vm_readv/writev) off. shm reads it once, when
// libfabric initializes its providers.
const ShmDisableCMA = "FI_SHM_DISABLE_CMA"

var (
	initOnce  sync.Once
	shmCMAOff atomic.Bool
)

// ShmCMAOffByDefault reports whether this process initialized libfabric
// with shm's CMA turned off by fitransfer's default (initialize).
func ShmCMAOffByDefault() bool { return shmCMAOff.Load() }

// initialize runs call, a libfabric call that initializes its providers
// if none did yet (fi_getinfo, fi_getparams, fi_fabric), after
// libfabric's first initialization with fitransfer's provider defaults.
//
// The one default: on libfabric 2.x, shm's CMA is off unless the user
// set FI_SHM_DISABLE_CMA. fitransfer already turns shm's fast path off
// there (FI_ORDER_RAR); what CMA still does is have the target copy
// with process_vm_readv/writev: every read, and writes over 4 KiB. shm's
// own bounce-buffer protocol (SAR) took 1.10 µs for an 8-byte read here
// against 2.31, and moved 64 KiB to 16 MiB about twice as fast
// (docs/PERFORMANCE.md). It is also what shm does toward the peers
// fitransfer routes over it in practice: the same-node peers CMA does not
// reach, and device memory (cma serves the others).
//
// The variable is in the environment only while an fi_getparams of
// initialize's own initializes libfabric: the caller's call then sees
// the environment as the user left it (fitransfer info -e prints what
// fi_info -e does), and processes started later (fabtests' tools) keep
// their defaults; one started by another goroutine at that moment
// inherits the variable.
func initialize(call func()) {
	initOnce.Do(func() {
		if RuntimeVersion().Major() < 2 {
			return
		}
		if _, set := os.LookupEnv(ShmDisableCMA); set {
			return
		}
		_ = os.Setenv(ShmDisableCMA, "1")
		defer func() { _ = os.Unsetenv(ShmDisableCMA) }()
		var list *C.struct_fi_param
		var n C.int
		if C.fi_getparams(&list, &n) == 0 {
			C.fi_freeparams(list)
		}
		shmCMAOff.Store(true)
	})
	call()
}
