package fabric

import "github.com/fitransfer/fitransfer/internal/ofi"

// The rest of libfabric that fitransfer's packages use: fabric is their
// one door to it, and internal/ofi (the cgo) is imported by fabric alone.
// These are the endpoint, registration, queue and parameter types of
// internal/ofi under their libfabric names.

// Endpoint is an open RDM endpoint with its AV, CQ and EQ.
type Endpoint = ofi.Endpoint

// EndpointOptions are the fi_setopt options fitransfer sets on an
// endpoint; OptionResults what the provider answered.
type (
	EndpointOptions = ofi.EndpointOptions
	OptionResults   = ofi.OptionResults
)

// MR is a memory registration; Desc its local descriptor (fi_mr_desc).
type (
	MR   = ofi.MR
	Desc = ofi.Desc
)

// Queue posts batches of RMA ops (Op) and reaps their completions;
// CQError is an error completion, EQError an asynchronous endpoint error.
type (
	Queue   = ofi.Queue
	Op      = ofi.Op
	CQError = ofi.CQError
	EQError = ofi.EQError
)

// NoSlot is the slot of a completion that carries no op context.
const NoSlot = ofi.NoSlot

// NewQueue makes a queue of batch ops per post and nslots op contexts.
func NewQueue(batch, nslots int) *Queue { return ofi.NewQueue(batch, nslots) }

// Completion levels and flags of ops.
const (
	OpCompletion       = ofi.OpCompletion
	OpInjectComplete   = ofi.OpInjectComplete
	OpTransmitComplete = ofi.OpTransmitComplete
	OpDeliveryComplete = ofi.OpDeliveryComplete
)

// Address formats of endpoint names.
const (
	AddrSockaddr    = ofi.AddrSockaddr
	AddrSockaddrIn  = ofi.AddrSockaddrIn
	AddrSockaddrIn6 = ofi.AddrSockaddrIn6
)

// Access bits of a registration (fi_mr_regattr's access).
const (
	AccessRead        = ofi.AccessRead
	AccessWrite       = ofi.AccessWrite
	AccessRemoteRead  = ofi.AccessRemoteRead
	AccessRemoteWrite = ofi.AccessRemoteWrite
)

// HMEM interfaces of registered memory.
const (
	HMEMSystem = ofi.HMEMSystem
	HMEMCUDA   = ofi.HMEMCUDA
)

// RuntimeVersion is the libfabric this process loaded (fi_version);
// CompiledVersion the headers fitransfer was built against.
func RuntimeVersion() Version  { return ofi.RuntimeVersion() }
func CompiledVersion() Version { return ofi.CompiledVersion() }

// HeadersHave is what the compiled headers define; CompiledFeatures says.
type HeadersHave = ofi.HeadersHave

// CompiledFeatures is what the headers fitransfer was built against have.
func CompiledFeatures() HeadersHave { return ofi.CompiledFeatures() }

// Param is one libfabric environment variable (fi_getparams), ParamType
// its type.
type (
	Param     = ofi.Param
	ParamType = ofi.ParamType
)

// The parameter types.
const (
	ParamString = ofi.ParamString
	ParamInt    = ofi.ParamInt
	ParamBool   = ofi.ParamBool
	ParamSizeT  = ofi.ParamSizeT
)

// Params lists libfabric's environment variables (fi_info -e).
func Params() ([]Param, error) { return ofi.Params() }

// ShmDisableCMA is shm's variable that turns its CMA off
// (FI_SHM_DISABLE_CMA).
const ShmDisableCMA = ofi.ShmDisableCMA

// ShmCMAOffByDefault reports whether this process initialized libfabric
// with shm's CMA turned off by fitransfer: on libfabric 2.x unless
// FI_SHM_DISABLE_CMA was set (a value in libfabric.conf does not count,
// and loses to fitransfer's unless FI_PREFER_SYSCONFIG is set). shm then
// moves RMA data through its own bounce buffers (SAR), which was faster
// here at every size than the target's process_vm_readv/writev
// (docs/PERFORMANCE.md). A peer whose shm has CMA on may still use it
// toward this process, which serves both. The variable is set only
// while libfabric initializes: processes this one starts keep their own
// defaults.
func ShmCMAOffByDefault() bool { return ofi.ShmCMAOffByDefault() }
