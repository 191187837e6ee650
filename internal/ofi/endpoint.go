package ofi

/*
#include "ofi.h"

// ft_eq_poll keeps no pointer it is given and calls no Go: without these,
// PollEQ's two output ints move to the heap, one allocation per poll of a
// busy loop's event queue.
#cgo noescape ft_eq_poll
#cgo nocallback ft_eq_poll

static inline uint64_t ft_cntr_read_u(uintptr_t cntr)
{
	return fi_cntr_read((struct fid_cntr *)cntr);
}
*/
import "C"

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Endpoint is an enabled RDM endpoint with its address vector (FI_AV_TABLE),
// completion queue (FI_CQ_FORMAT_CONTEXT, polled) and event queue. Its
// data-path methods are not safe for concurrent use: one goroutine (the
// progress loop) drives an endpoint.
type Endpoint struct {
	e        C.struct_ft_ep
	name     []byte
	waitable bool
	// sigMu guards sigFd, the eventfd Signal writes and Wait polls (-1
	// once closed: a Signal racing Close must not write to a reused fd).
	sigMu sync.Mutex
	sigFd int
	eqMsg *C.char // C buffer PollEQ reads messages into
	opts  OptionResults
}

const eqMsgLen = 256

// OpenEndpoint opens, binds and enables an endpoint on the domain, with the
// fi_info the domain was opened from. cqSize 0 lets the provider choose.
// With cqWait the CQ gets a wait object if the provider has one (see
// Waitable).
func (d *Domain) OpenEndpoint(cqSize int, cqWait bool, opts EndpointOptions) (*Endpoint, error) {
	if err := d.beforeEndpoint(); err != nil {
		return nil, err
	}
	ep := &Endpoint{}
	var stage *C.char
	wait, waitable := C.int(0), C.int(0)
	if cqWait {
		wait = 1
	}
	o := C.struct_ft_ep_opts{shared_memory_permitted: optBool(opts.SharedMemoryPermitted),
		cuda_api_permitted: optBool(opts.CUDAAPIPermitted), remote_cntr: 0}
	if opts.RemoteCounter {
		o.remote_cntr = 1
	}
	if rc := C.ft_ep_open(d.fabric, d.c, d.info, C.size_t(cqSize), wait, &waitable, &o, &ep.e, &stage); rc != 0 {
		return nil, check(C.GoString(stage), rc)
	}
	if opts.SharedMemoryPermitted != nil {
		ep.opts.SharedMemoryPermitted = check("fi_setopt(FI_OPT_SHARED_MEMORY_PERMITTED)", o.shared_memory_rc)
	}
	if opts.CUDAAPIPermitted != nil {
		ep.opts.CUDAAPIPermitted = check("fi_setopt(FI_OPT_CUDA_API_PERMITTED)", o.cuda_api_rc)
	}
	ep.waitable = waitable == 1
	ep.sigFd = -1
	if ep.waitable {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			C.ft_ep_close(&ep.e)
			return nil, fmt.Errorf("eventfd for the progress loop's wake-ups: %w", err)
		}
		ep.sigFd = fd
	}
	ep.eqMsg = (*C.char)(C.calloc(eqMsgLen, 1))
	name, err := ep.getName()
	if err != nil {
		ep.Close() // the eventfd and eqMsg too
		return nil, err
	}
	ep.name = name
	return ep, nil
}

// EndpointOptions are endpoint options set before the endpoint is
// enabled; nil leaves one alone.
type EndpointOptions struct {
	// SharedMemoryPermitted is FI_OPT_SHARED_MEMORY_PERMITTED (headers
	// 1.21+): false keeps a provider (efa) from setting up its own shm
	// path for same-node peers.
	SharedMemoryPermitted *bool
	// CUDAAPIPermitted is FI_OPT_CUDA_API_PERMITTED (headers 1.18+): may
	// the provider call the CUDA API.
	CUDAAPIPermitted *bool
	// RemoteCounter binds a counter of peers' RMA ops on the endpoint
	// (RemoteOps), if the provider takes one.
	RemoteCounter bool
}

// OptionResults are fi_setopt's answers for the options asked: nil when
// accepted, ErrNoSys when the headers this binary was compiled with do not
// declare the option, else the provider's refusal (ErrNoProtoOpt: it does
// not know the option).
type OptionResults struct {
	SharedMemoryPermitted error
	CUDAAPIPermitted      error
}

// Options returns what the provider answered to the EndpointOptions the
// endpoint was opened with.
func (ep *Endpoint) Options() OptionResults { return ep.opts }

func optBool(b *bool) C.int {
	switch {
	case b == nil:
		return -1
	case *b:
		return 1
	}
	return 0
}

func (ep *Endpoint) getName() ([]byte, error) {
	buf := make([]byte, 256)
	n := C.size_t(len(buf))
	rc := C.fi_getname(&ep.e.ep.fid, unsafe.Pointer(&buf[0]), &n)
	if rc == -C.FI_ETOOSMALL {
		buf = make([]byte, n)
		rc = C.fi_getname(&ep.e.ep.fid, unsafe.Pointer(&buf[0]), &n)
	}
	if err := check("fi_getname", rc); err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// Waitable reports whether the CQ has a wait fd: Queue.Wait may block on
// it and Signal wakes it.
func (ep *Endpoint) Waitable() bool { return ep.waitable }

// RemoteOps counts peers' RMA ops on the endpoint so far, when it was
// opened with RemoteCounter and the provider took the counter (HasRemoteOps);
// else 0. Reading drives the provider's progress, as Reap does.
func (ep *Endpoint) RemoteOps() uint64 {
	if ep.e.remote_cntr == nil {
		return 0
	}
	// The counter, not &ep.e: cgo would check that Go struct for Go
	// pointers at every call (see queue.go), and a busy target reads it
	// every round.
	return uint64(C.ft_cntr_read_u(cptr(unsafe.Pointer(ep.e.remote_cntr))))
}

// HasRemoteOps reports whether RemoteOps counts.
func (ep *Endpoint) HasRemoteOps() bool { return ep.e.remote_cntr != nil }

// TryWait is fi_trywait on the CQ: true when nothing is pending and the
// caller may Block; false when it must read the CQ first. Like every
// libfabric call, serialized with the endpoint's other calls. Only for
// Waitable endpoints.
func (ep *Endpoint) TryWait() (bool, error) {
	rc := C.ft_trywait(&ep.e)
	if rc == -C.FI_EAGAIN {
		return false, nil
	}
	return rc == 0, check("fi_trywait", rc)
}

// Block waits up to timeoutMs for traffic on the CQ's wait fd or for
// Signal, and reports which came: traffic when the CQ's fd woke it (with
// or without a Signal), signalled when a Signal alone did. It calls no
// libfabric function: other goroutines may drive the endpoint meanwhile
// (and then Signal, so that the blocked one calls TryWait again). Only
// after TryWait said true, and on the goroutine that closes the endpoint
// (so sigFd is read without sigMu: only Close changes it).
func (ep *Endpoint) Block(timeoutMs int) (traffic, signalled bool, err error) {
	rc := C.ft_block(&ep.e, C.int(ep.sigFd), C.int(timeoutMs))
	if rc < 0 {
		return false, false, fmt.Errorf("poll on the CQ's wait fd: revents %#x (POLLERR, POLLHUP or POLLNVAL)", -rc)
	}
	return rc == 2, rc == 1, nil
}

// Signal wakes a Wait in progress, or the next one. Safe from any
// goroutine, also after Close.
func (ep *Endpoint) Signal() {
	ep.sigMu.Lock()
	defer ep.sigMu.Unlock()
	if ep.sigFd >= 0 {
		one := [8]byte{1}
		_, _ = unix.Write(ep.sigFd, one[:]) // EAGAIN: a wake-up is pending already
	}
}

// Name is the endpoint's address as fi_getname returns it; a peer passes it
// to InsertAddr.
func (ep *Endpoint) Name() []byte { return ep.name }

// InsertAddr adds a peer's endpoint name to the address vector and returns
// its fi_addr_t.
func (ep *Endpoint) InsertAddr(name []byte) (uint64, error) {
	if len(name) == 0 {
		return 0, &CallError{Call: "fi_av_insert", Errno: ErrInval}
	}
	p := C.CBytes(name)
	defer C.free(p)
	var addr C.uint64_t
	if err := check("fi_av_insert", C.ft_av_insert(&ep.e, p, &addr)); err != nil {
		return 0, err
	}
	return uint64(addr), nil
}

// RemoveAddr removes a peer from the address vector (fi_av_remove); a
// later InsertAddr of the same name gets a fresh connection on
// connection-oriented providers (tcp;ofi_rxm).
func (ep *Endpoint) RemoveAddr(addr uint64) error {
	return check("fi_av_remove", C.ft_av_remove(&ep.e, C.uint64_t(addr)))
}

// MaxRMASize is fi_getopt(FI_OPT_MAX_RMA_SIZE) (libfabric 1.22+); an error
// wrapping ErrNoSys or ErrNoProtoOpt when unavailable.
func (ep *Endpoint) MaxRMASize() (uint64, error) {
	var n C.size_t
	if err := check("fi_getopt(FI_OPT_MAX_RMA_SIZE)", C.ft_ep_max_rma_size(ep.e.ep, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}

// EQError is an asynchronous endpoint error read from the event queue.
type EQError struct {
	Errno     Errno  // err of the fi_eq_err_entry
	ProvErrno int    // prov_errno
	Message   string // fi_eq_strerror
}

// PollEQ reads one event queue entry: an asynchronous error, or nil when
// there was none.
func (ep *Endpoint) PollEQ() (*EQError, error) {
	var errno, provErrno C.int
	rc := C.ft_eq_poll(ep.e.eq, ep.eqMsg, eqMsgLen, &errno, &provErrno)
	switch {
	case rc < 0:
		return nil, check("fi_eq_read", rc)
	case rc == 1:
		return &EQError{Errno: Errno(errno), ProvErrno: int(provErrno), Message: C.GoString(ep.eqMsg)}, nil
	}
	return nil, nil
}

// Close closes the endpoint, its AV, CQ and EQ; closing twice is a no-op.
// Memory registrations bound to it must be closed first.
func (ep *Endpoint) Close() {
	if ep == nil {
		return
	}
	C.ft_ep_close(&ep.e)
	ep.sigMu.Lock()
	if ep.sigFd >= 0 {
		_ = unix.Close(ep.sigFd)
		ep.sigFd = -1
	}
	ep.sigMu.Unlock()
	if ep.eqMsg != nil {
		C.free(unsafe.Pointer(ep.eqMsg))
		ep.eqMsg = nil
	}
}

// ProbeEFAEmulated opens a throwaway endpoint (not enabled) and asks the
// efa provider whether it emulates RMA read and write:
// fi_getopt(FI_OPT_EFA_EMULATED_READ/WRITE), libfabric 1.18+. Built against
// older headers it returns an error wrapping ErrNoSys, and on a domain of
// another provider one wrapping ErrNoProtoOpt, without opening anything:
// other providers crash on this probe (tcp;ofi_rxm 1.17 when the endpoint
// that was never enabled is closed, shm 2.1 in fi_getopt).
func (d *Domain) ProbeEFAEmulated() (read, write bool, err error) {
	if !CompiledFeatures().EFAEmulatedOpts {
		return false, false, check("fi_getopt(FI_OPT_EFA_EMULATED_READ)", -C.FI_ENOSYS)
	}
	if d.info.fabric_attr == nil || C.GoString(d.info.fabric_attr.prov_name) != "efa" {
		return false, false, check("fi_getopt(FI_OPT_EFA_EMULATED_READ) outside efa", -C.FI_ENOPROTOOPT)
	}
	if err := d.beforeEndpoint(); err != nil {
		return false, false, err
	}
	var ep *C.struct_fid_ep
	if err := check("fi_endpoint", C.ft_endpoint(d.c, d.info, &ep)); err != nil {
		return false, false, err
	}
	defer C.fi_close(&ep.fid)
	r := C.ft_ep_efa_emulated(ep, 0)
	if err := check("fi_getopt(FI_OPT_EFA_EMULATED_READ)", r); err != nil {
		return false, false, err
	}
	w := C.ft_ep_efa_emulated(ep, 1)
	if err := check("fi_getopt(FI_OPT_EFA_EMULATED_WRITE)", w); err != nil {
		return false, false, err
	}
	return r == 1, w == 1, nil
}

// BeforeEFAEndpoint, when set, is called before an endpoint of the efa
// provider's RDM protocol fabric ("efa", not "efa-direct") is opened, with
// the domain's name; an error stops the open. From libfabric 1.18 that
// open can abort() the process (efa_rdm_get_use_device_rdma, called from
// prov/efa/src/rdm/efa_rdm_ep_fiops.c@v2.1.0:503), and package fabric,
// which sets the hook, decides in a child process whether it would.
var BeforeEFAEndpoint func(domain string) error

func (d *Domain) beforeEndpoint() error {
	if BeforeEFAEndpoint == nil || d.info == nil || d.info.fabric_attr == nil || d.info.ep_attr == nil {
		return nil
	}
	if C.GoString(d.info.fabric_attr.prov_name) != "efa" || C.GoString(d.info.fabric_attr.name) == "efa-direct" ||
		EPType(d.info.ep_attr._type) != EPRDM {
		return nil
	}
	return BeforeEFAEndpoint(goString(d.info.domain_attr.name))
}

// TryEndpoint opens an endpoint of the domain (fi_endpoint, not enabled)
// and closes it at once: the call that, on efa from libfabric 1.18, reads
// FI_EFA_USE_DEVICE_RDMA and may abort(). Package fabric's probe child
// uses it where the headers lack FI_OPT_EFA_EMULATED_READ/WRITE.
func (d *Domain) TryEndpoint() error {
	if err := d.beforeEndpoint(); err != nil {
		return err
	}
	var ep *C.struct_fid_ep
	if err := check("fi_endpoint", C.ft_endpoint(d.c, d.info, &ep)); err != nil {
		return err
	}
	return check("fi_close(endpoint)", C.fi_close(&ep.fid))
}

// Abort calls the C library's abort(), as libfabric does on a fatal
// setting. Package fabric's probe child calls it only when a test asks,
// to check that an abort in the child is caught and reported.
func Abort() { C.abort() }

// HeadersHave reports which optional libfabric features the headers this
// binary was compiled with declare.
type HeadersHave struct {
	EFAEmulatedOpts  bool `json:"efa_emulated_opts"`    // FI_OPT_EFA_EMULATED_READ/WRITE (1.18)
	CUDAAPIPermitted bool `json:"cuda_api_permitted"`   // FI_OPT_CUDA_API_PERMITTED (1.18)
	SharedMemPermit  bool `json:"shared_mem_permitted"` // FI_OPT_SHARED_MEMORY_PERMITTED (1.21)
	MaxRMASize       bool `json:"max_rma_size"`         // FI_OPT_MAX_RMA_SIZE (1.22)
	EFADirectFabric  bool `json:"efa_direct_fabric"`    // the efa-direct fabric (2.1)
}

// String lists the features by their libfabric names.
func (h HeadersHave) String() string {
	var on []string
	add := func(ok bool, name string) {
		if ok {
			on = append(on, name)
		}
	}
	add(h.EFAEmulatedOpts, "FI_OPT_EFA_EMULATED_READ/WRITE")
	add(h.CUDAAPIPermitted, "FI_OPT_CUDA_API_PERMITTED")
	add(h.SharedMemPermit, "FI_OPT_SHARED_MEMORY_PERMITTED")
	add(h.MaxRMASize, "FI_OPT_MAX_RMA_SIZE")
	add(h.EFADirectFabric, "efa-direct")
	if len(on) == 0 {
		return "none (headers older than 1.18)"
	}
	return strings.Join(on, ", ")
}

// CompiledFeatures reports the optional features of the compiled headers.
func CompiledFeatures() HeadersHave {
	v := CompiledVersion()
	return HeadersHave{
		EFAEmulatedOpts:  v.AtLeast(1, 18),
		CUDAAPIPermitted: v.AtLeast(1, 18),
		SharedMemPermit:  v.AtLeast(1, 21),
		MaxRMASize:       v.AtLeast(1, 22),
		EFADirectFabric:  v.AtLeast(2, 1),
	}
}
