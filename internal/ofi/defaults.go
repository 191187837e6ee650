package ofi

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
	initOnce     sync.Once
	keepDefaults atomic.Bool
	shmCMAOff    atomic.Bool
)

// KeepProviderDefaults makes libfabric initialize with its providers' own
// defaults, as fi_info does: fitransfer info calls it before any other
// libfabric call, so that what it prints is fi_info's. It has no effect
// once libfabric has initialized.
func KeepProviderDefaults() { keepDefaults.Store(true) }

// ShmCMAOffByDefault reports whether this process initialized libfabric
// with shm's CMA turned off by fitransfer's default (initialize).
func ShmCMAOffByDefault() bool { return shmCMAOff.Load() }

// initialize runs call, a libfabric call that initializes its providers
// if none did yet (fi_getinfo, fi_getparams), with fitransfer's provider
// defaults in the environment the first time; later calls wait for the
// first to return.
//
// The one default: on libfabric 2.x, shm's CMA is off unless the user
// set FI_SHM_DISABLE_CMA. fitransfer already turns shm's fast path off
// there (FI_ORDER_RAR); what CMA still does is have the target copy
// with process_vm_readv/writev: every read, and writes over 4 KiB. shm's
// own bounce-buffer protocol (SAR) took 1.00 µs for an 8-byte read here
// against 2.27, and moved 64 KiB to 16 MiB about twice as fast
// (docs/PERFORMANCE.md). It is also what shm does for the peers it serves
// in practice: the same-node peers CMA does not reach, and device memory
// (cma serves the others). The variable is set for the call only, so
// that processes this one starts (fabtests' tools) keep their defaults.
func initialize(call func()) {
	first := false
	initOnce.Do(func() {
		first = true
		if keepDefaults.Load() || RuntimeVersion().Major() < 2 {
			call()
			return
		}
		if _, set := os.LookupEnv(ShmDisableCMA); set {
			call()
			return
		}
		_ = os.Setenv(ShmDisableCMA, "1")
		defer func() { _ = os.Unsetenv(ShmDisableCMA) }()
		shmCMAOff.Store(true)
		call()
	})
	if !first {
		call()
	}
}
