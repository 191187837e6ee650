package fabric

import "github.com/fitransfer/fitransfer/internal/ofi"

// Info is one fi_info: caps, mode, addresses and every attribute group.
// JSON field names are libfabric's (see docs/info-json.md).
type Info = ofi.Info

// TxAttr is fi_tx_attr.
type TxAttr = ofi.TxAttr

// RxAttr is fi_rx_attr.
type RxAttr = ofi.RxAttr

// EPAttr is fi_ep_attr.
type EPAttr = ofi.EPAttr

// DomainAttr is fi_domain_attr.
type DomainAttr = ofi.DomainAttr

// FabricAttr is fi_fabric_attr.
type FabricAttr = ofi.FabricAttr

// NIC is fid_nic: device, bus and link attributes of a domain's hardware.
type NIC = ofi.NIC

// DeviceAttr is fi_device_attr, a NIC's name and ids.
type DeviceAttr = ofi.DeviceAttr

// BusAttr is fi_bus_attr; PCI is set for FI_BUS_PCI.
type BusAttr = ofi.BusAttr

// PCIAttr is fi_pci_attr: the NIC's PCI address.
type PCIAttr = ofi.PCIAttr

// LinkAttr is fi_link_attr: the NIC's link, its speed in bits per second.
type LinkAttr = ofi.LinkAttr

// Addr is an endpoint address with its format.
type Addr = ofi.Addr

// Version is a libfabric version (major<<16 | minor).
type Version = ofi.Version

// Caps is a set of capability bits; it prints as "FI_MSG | FI_RMA".
type Caps = ofi.Caps

// Mode is a set of mode bits.
type Mode = ofi.Mode

// OpFlags is a set of operation flags.
type OpFlags = ofi.OpFlags

// MRMode is a set of memory registration mode bits.
type MRMode = ofi.MRMode

// EPType is an endpoint type.
type EPType = ofi.EPType

// AddrFormat is an address format.
type AddrFormat = ofi.AddrFormat

// Errno is a libfabric error number; Error() is fi_strerror's text.
type Errno = ofi.Errno

// CallError is a failed libfabric call and its Errno.
type CallError = ofi.CallError

// BadNameError is an unknown flag or enum name, with the valid names.
type BadNameError = ofi.BadNameError

// Fabric is an open fabric.
type Fabric = ofi.Fabric

// Domain is an open domain.
type Domain = ofi.Domain

// Sentinel errors for errors.Is. They are Errno values, so any libfabric
// error with the same number matches.
const (
	ErrAgain       = ofi.ErrAgain       // FI_EAGAIN: resources busy, progress and retry
	ErrNoData      = ofi.ErrNoData      // FI_ENODATA: no provider matches the hints
	ErrNoSys       = ofi.ErrNoSys       // FI_ENOSYS: not implemented (e.g. API version too new)
	ErrNoMem       = ofi.ErrNoMem       // FI_ENOMEM
	ErrInval       = ofi.ErrInval       // FI_EINVAL
	ErrAccess      = ofi.ErrAccess      // FI_EACCES
	ErrIO          = ofi.ErrIO          // FI_EIO: EFA device errors up to 1.21
	ErrCanceled    = ofi.ErrCanceled    // FI_ECANCELED: flushed or canceled op
	ErrTimedOut    = ofi.ErrTimedOut    // FI_ETIMEDOUT
	ErrHostUnreach = ofi.ErrHostUnreach // FI_EHOSTUNREACH
	ErrConnRefused = ofi.ErrConnRefused // FI_ECONNREFUSED
	ErrRemoteIO    = ofi.ErrRemoteIO    // FI_EREMOTEIO
	ErrAvail       = ofi.ErrAvail       // FI_EAVAIL: an error entry is waiting in the CQ/EQ
	ErrNoKey       = ofi.ErrNoKey       // FI_ENOKEY: requested MR key in use
	ErrKeyRejected = ofi.ErrKeyRejected // FI_EKEYREJECTED: bad key at the target
	ErrTrunc       = ofi.ErrTrunc       // FI_ETRUNC
	ErrOverrun     = ofi.ErrOverrun     // FI_EOVERRUN: CQ overrun
	ErrOpNotSupp   = ofi.ErrOpNotSupp   // FI_EOPNOTSUPP
	ErrNoProtoOpt  = ofi.ErrNoProtoOpt  // FI_ENOPROTOOPT: fi_getopt option unknown
	ErrNotConn     = ofi.ErrNotConn     // FI_ENOTCONN: the peer's endpoint is gone
	ErrConnReset   = ofi.ErrConnReset   // FI_ECONNRESET
	ErrConnAborted = ofi.ErrConnAborted // FI_ECONNABORTED: the peer stopped answering
	ErrMsgSize     = ofi.ErrMsgSize     // FI_EMSGSIZE
	ErrNoRx        = ofi.ErrNoRx        // FI_ENORX: receiver not ready
	ErrHostDown    = ofi.ErrHostDown    // FI_EHOSTDOWN
	ErrOther       = ofi.ErrOther       // FI_EOTHER: unspecified
)

// Capability bits fitransfer uses by name.
const (
	CapMsg         = ofi.CapMsg
	CapRMA         = ofi.CapRMA
	CapRead        = ofi.CapRead
	CapWrite       = ofi.CapWrite
	CapRemoteRead  = ofi.CapRemoteRead
	CapRemoteWrite = ofi.CapRemoteWrite
	CapHMEM        = ofi.CapHMEM
	CapLocalComm   = ofi.CapLocalComm
	CapRemoteComm  = ofi.CapRemoteComm
)

// Memory registration mode bits fitransfer supports.
const (
	MRLocal     = ofi.MRLocal
	MRVirtAddr  = ofi.MRVirtAddr
	MRAllocated = ofi.MRAllocated
	MRProvKey   = ofi.MRProvKey
	MREndpoint  = ofi.MREndpoint
	MRHMEM      = ofi.MRHMEM
)

// EPRDM is the reliable datagram endpoint type fitransfer uses.
const EPRDM = ofi.EPRDM

// MakeVersion builds a Version from major and minor.
func MakeVersion(major, minor int) Version { return ofi.MakeVersion(major, minor) }

// ParseCaps parses "FI_MSG|FI_RMA" (names as fi_info -c takes them).
func ParseCaps(s string) (Caps, error) { return ofi.ParseCaps(s) }

// ParseMode parses "FI_CONTEXT|FI_CONTEXT2".
func ParseMode(s string) (Mode, error) { return ofi.ParseMode(s) }

// ParseEPType parses "FI_EP_RDM".
func ParseEPType(s string) (EPType, error) { return ofi.ParseEPType(s) }

// ParseAddrFormat parses "FI_SOCKADDR_IN".
func ParseAddrFormat(s string) (AddrFormat, error) { return ofi.ParseAddrFormat(s) }

// OpenFabric opens the fabric an Info names; close it after its domains.
func OpenFabric(i *Info) (*Fabric, error) { return ofi.OpenFabric(i) }
