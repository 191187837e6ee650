package ofi

import (
	"encoding/json"
	"fmt"
	"strings"
)

// EPType is an endpoint type (FI_EP_*).
type EPType uint32

// Endpoint types.
const (
	EPUnspec EPType = 0
	EPMsg    EPType = 1
	EPDgram  EPType = 2
	EPRDM    EPType = 3
)

// Protocol is an endpoint protocol (FI_PROTO_*).
type Protocol uint32

// AddrFormat is an address format (FI_FORMAT_UNSPEC, FI_SOCKADDR_IN, ...).
type AddrFormat uint32

// Address formats fitransfer renders itself.
const (
	AddrUnspec      AddrFormat = 0
	AddrSockaddr    AddrFormat = 1
	AddrSockaddrIn  AddrFormat = 2
	AddrSockaddrIn6 AddrFormat = 3
	AddrStr         AddrFormat = 9
	AddrEFA         AddrFormat = 12
)

// Threading is a domain threading model (FI_THREAD_*).
type Threading uint32

// Progress is a progress model (FI_PROGRESS_*).
type Progress uint32

// Progress models.
const (
	ProgressUnspec Progress = 0
	ProgressAuto   Progress = 1
	ProgressManual Progress = 2
)

// ResourceMgmt is a resource management setting (FI_RM_*).
type ResourceMgmt uint32

// AVType is an address vector type (FI_AV_*).
type AVType uint32

// Address vector types.
const (
	AVUnspec AVType = 0
	AVMap    AVType = 1
	AVTable  AVType = 2
)

// BusType is a NIC's bus type (FI_BUS_*).
type BusType uint32

// LinkState is a NIC link state (FI_LINK_*).
type LinkState uint32

type enumTable struct {
	what  string
	names []string // index = value
}

var (
	epTypeNames = enumTable{"endpoint type", []string{"FI_EP_UNSPEC", "FI_EP_MSG", "FI_EP_DGRAM", "FI_EP_RDM", "FI_EP_SOCK_STREAM", "FI_EP_SOCK_DGRAM"}}
	// Protocol values are an ABI enum; the 2.x names extend the 1.17 list.
	protocolNames = enumTable{"protocol", []string{
		"FI_PROTO_UNSPEC", "FI_PROTO_RDMA_CM_IB_RC", "FI_PROTO_IWARP", "FI_PROTO_IB_UD",
		"FI_PROTO_PSMX", "FI_PROTO_UDP", "FI_PROTO_SOCK_TCP", "FI_PROTO_MXM",
		"FI_PROTO_IWARP_RDM", "FI_PROTO_IB_RDM", "FI_PROTO_GNI", "FI_PROTO_RXM",
		"FI_PROTO_RXD", "FI_PROTO_MLX", "FI_PROTO_NETWORKDIRECT", "FI_PROTO_PSMX2",
		"FI_PROTO_SHM", "FI_PROTO_MRAIL", "FI_PROTO_RSTREAM", "FI_PROTO_RDMA_CM_IB_XRC",
		"FI_PROTO_EFA", "FI_PROTO_PSMX3", "FI_PROTO_RXM_TCP", "FI_PROTO_OPX",
		"FI_PROTO_CXI", "FI_PROTO_XNET", "FI_PROTO_COLL", "FI_PROTO_UCX",
		"FI_PROTO_SM2", "FI_PROTO_CXI_RNR", "FI_PROTO_LPP", "FI_PROTO_LNX",
	}}
	addrFormatNames = enumTable{"address format", []string{
		"FI_FORMAT_UNSPEC", "FI_SOCKADDR", "FI_SOCKADDR_IN", "FI_SOCKADDR_IN6",
		"FI_SOCKADDR_IB", "FI_ADDR_PSMX", "FI_ADDR_GNI", "FI_ADDR_BGQ", "FI_ADDR_MLX",
		"FI_ADDR_STR", "FI_ADDR_PSMX2", "FI_ADDR_IB_UD", "FI_ADDR_EFA", "FI_ADDR_PSMX3",
		"FI_ADDR_OPX", "FI_ADDR_CXI", "FI_ADDR_UCX",
	}}
	threadingNames    = enumTable{"threading", []string{"FI_THREAD_UNSPEC", "FI_THREAD_SAFE", "FI_THREAD_FID", "FI_THREAD_DOMAIN", "FI_THREAD_COMPLETION", "FI_THREAD_ENDPOINT"}}
	progressNames     = enumTable{"progress", []string{"FI_PROGRESS_UNSPEC", "FI_PROGRESS_AUTO", "FI_PROGRESS_MANUAL", "FI_PROGRESS_CONTROL_UNIFIED"}}
	resourceMgmtNames = enumTable{"resource management", []string{"FI_RM_UNSPEC", "FI_RM_DISABLED", "FI_RM_ENABLED"}}
	avTypeNames       = enumTable{"av type", []string{"FI_AV_UNSPEC", "FI_AV_MAP", "FI_AV_TABLE"}}
	busTypeNames      = enumTable{"bus type", []string{"FI_BUS_UNKNOWN", "FI_BUS_PCI"}}
	linkStateNames    = enumTable{"link state", []string{"FI_LINK_UNKNOWN", "FI_LINK_DOWN", "FI_LINK_UP"}}
)

func (t enumTable) name(v uint32) string {
	if int(v) < len(t.names) {
		return t.names[v]
	}
	if v&(1<<31) != 0 {
		return "Provider specific"
	}
	return fmt.Sprintf("Unknown(%d)", v)
}

// parse accepts a name in any case, whole ("FI_EP_RDM") or by a suffix
// that names one value only ("rdm", "EP_RDM").
func (t enumTable) parse(s string) (uint32, error) {
	u := strings.ToUpper(strings.TrimSpace(s))
	match, count := 0, 0
	for i, n := range t.names {
		if n == u {
			return uint32(i), nil
		}
		if u != "" && strings.HasSuffix(n, "_"+u) {
			match, count = i, count+1
		}
	}
	if count == 1 {
		return uint32(match), nil
	}
	return 0, &BadNameError{What: t.what, Name: s, Valid: t.names}
}

func (t enumTable) marshal(v uint32) ([]byte, error) { return json.Marshal(t.name(v)) }

func (t enumTable) unmarshal(b []byte) (uint32, error) {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		var n uint32
		if err2 := json.Unmarshal(b, &n); err2 == nil {
			return n, nil
		}
		return 0, err
	}
	return t.parse(s)
}

// String returns the libfabric name, e.g. "FI_EP_RDM".
func (e EPType) String() string { return epTypeNames.name(uint32(e)) }

// MarshalJSON encodes the name.
func (e EPType) MarshalJSON() ([]byte, error) { return epTypeNames.marshal(uint32(e)) }

// UnmarshalJSON decodes the name.
func (e *EPType) UnmarshalJSON(b []byte) error {
	v, err := epTypeNames.unmarshal(b)
	*e = EPType(v)
	return err
}

// ParseEPType parses "FI_EP_RDM" (or "rdm") as fi_info -t does. 2.x removed
// the socket endpoint types, so they are refused when the library is 2.x.
func ParseEPType(s string) (EPType, error) {
	t := epTypeNames
	if RuntimeVersion().Major() >= 2 {
		t.names = t.names[:4]
	}
	v, err := t.parse(s)
	return EPType(v), err
}

// String returns the libfabric name, e.g. "FI_PROTO_RXM".
func (p Protocol) String() string { return protocolNames.name(uint32(p)) }

// MarshalJSON encodes the name.
func (p Protocol) MarshalJSON() ([]byte, error) { return protocolNames.marshal(uint32(p)) }

// UnmarshalJSON decodes the name.
func (p *Protocol) UnmarshalJSON(b []byte) error {
	v, err := protocolNames.unmarshal(b)
	*p = Protocol(v)
	return err
}

// String returns the libfabric name, e.g. "FI_SOCKADDR_IN".
func (a AddrFormat) String() string { return addrFormatNames.name(uint32(a)) }

// MarshalJSON encodes the name.
func (a AddrFormat) MarshalJSON() ([]byte, error) { return addrFormatNames.marshal(uint32(a)) }

// UnmarshalJSON decodes the name.
func (a *AddrFormat) UnmarshalJSON(b []byte) error {
	v, err := addrFormatNames.unmarshal(b)
	*a = AddrFormat(v)
	return err
}

// ParseAddrFormat parses "FI_SOCKADDR_IN" as fi_info -a does.
func ParseAddrFormat(s string) (AddrFormat, error) {
	v, err := addrFormatNames.parse(s)
	return AddrFormat(v), err
}

// String returns the libfabric name, e.g. "FI_THREAD_SAFE".
func (t Threading) String() string { return threadingNames.name(uint32(t)) }

// MarshalJSON encodes the name.
func (t Threading) MarshalJSON() ([]byte, error) { return threadingNames.marshal(uint32(t)) }

// UnmarshalJSON decodes the name.
func (t *Threading) UnmarshalJSON(b []byte) error {
	v, err := threadingNames.unmarshal(b)
	*t = Threading(v)
	return err
}

// String returns the libfabric name, e.g. "FI_PROGRESS_MANUAL".
func (p Progress) String() string { return progressNames.name(uint32(p)) }

// MarshalJSON encodes the name.
func (p Progress) MarshalJSON() ([]byte, error) { return progressNames.marshal(uint32(p)) }

// UnmarshalJSON decodes the name.
func (p *Progress) UnmarshalJSON(b []byte) error {
	v, err := progressNames.unmarshal(b)
	*p = Progress(v)
	return err
}

// String returns the libfabric name, e.g. "FI_RM_ENABLED".
func (r ResourceMgmt) String() string { return resourceMgmtNames.name(uint32(r)) }

// MarshalJSON encodes the name.
func (r ResourceMgmt) MarshalJSON() ([]byte, error) { return resourceMgmtNames.marshal(uint32(r)) }

// UnmarshalJSON decodes the name.
func (r *ResourceMgmt) UnmarshalJSON(b []byte) error {
	v, err := resourceMgmtNames.unmarshal(b)
	*r = ResourceMgmt(v)
	return err
}

// String returns the libfabric name, e.g. "FI_AV_TABLE".
func (a AVType) String() string { return avTypeNames.name(uint32(a)) }

// MarshalJSON encodes the name.
func (a AVType) MarshalJSON() ([]byte, error) { return avTypeNames.marshal(uint32(a)) }

// UnmarshalJSON decodes the name.
func (a *AVType) UnmarshalJSON(b []byte) error {
	v, err := avTypeNames.unmarshal(b)
	*a = AVType(v)
	return err
}

// String returns the libfabric name, e.g. "FI_BUS_PCI".
func (b BusType) String() string { return busTypeNames.name(uint32(b)) }

// MarshalJSON encodes the name.
func (b BusType) MarshalJSON() ([]byte, error) { return busTypeNames.marshal(uint32(b)) }

// UnmarshalJSON decodes the name.
func (b *BusType) UnmarshalJSON(data []byte) error {
	v, err := busTypeNames.unmarshal(data)
	*b = BusType(v)
	return err
}

// String returns the libfabric name, e.g. "FI_LINK_UP".
func (l LinkState) String() string { return linkStateNames.name(uint32(l)) }

// MarshalJSON encodes the name.
func (l LinkState) MarshalJSON() ([]byte, error) { return linkStateNames.marshal(uint32(l)) }

// UnmarshalJSON decodes the name.
func (l *LinkState) UnmarshalJSON(b []byte) error {
	v, err := linkStateNames.unmarshal(b)
	*l = LinkState(v)
	return err
}
