package ofi

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
)

// Info is one fi_info: a provider's answer to fi_getinfo, with every
// attribute group as a Go value. The JSON field names are libfabric's field
// names and are stable (docs/info-json.md). Zero values mean "unspecified",
// as in a hints structure from fi_allocinfo.
type Info struct {
	Caps       Caps       `json:"caps"`
	Mode       Mode       `json:"mode"`
	AddrFormat AddrFormat `json:"addr_format"`
	SrcAddr    Addr       `json:"src_addr"`
	DestAddr   Addr       `json:"dest_addr"`
	Tx         TxAttr     `json:"tx_attr"`
	Rx         RxAttr     `json:"rx_attr"`
	EP         EPAttr     `json:"ep_attr"`
	Domain     DomainAttr `json:"domain_attr"`
	Fabric     FabricAttr `json:"fabric_attr"`
	NIC        *NIC       `json:"nic,omitempty"`

	// tostr is libfabric's own fi_tostr rendering of the fi_info this value
	// was converted from (empty for Infos built in Go).
	tostr string
}

// Addr is an endpoint address in the Info's address format. It prints as
// libfabric does ("fi_sockaddr_in://127.0.0.1:0") and encodes in JSON as
// {"len": n, "str": ..., "hex": ...}; Format is the enclosing Info's
// addr_format.
type Addr struct {
	Format AddrFormat
	Bytes  []byte
}

// String renders the address the way libfabric's ofi_straddr does for the
// formats fitransfer meets, and as hex otherwise; "(null)" when empty.
func (a Addr) String() string {
	b := a.Bytes
	if len(b) == 0 {
		return "(null)"
	}
	family := uint16(0)
	if len(b) >= 2 {
		family = binary.LittleEndian.Uint16(b)
	}
	switch {
	case (a.Format == AddrSockaddrIn || a.Format == AddrSockaddr && family == 2) && len(b) >= 8:
		return fmt.Sprintf("fi_sockaddr_in://%s:%d", net.IP(b[4:8]), binary.BigEndian.Uint16(b[2:4]))
	case (a.Format == AddrSockaddrIn6 || a.Format == AddrSockaddr && family == 10) && len(b) >= 24:
		return fmt.Sprintf("fi_sockaddr_in6://[%s]:%d", net.IP(b[8:24]), binary.BigEndian.Uint16(b[2:4]))
	case a.Format == AddrEFA && len(b) >= 24:
		return fmt.Sprintf("fi_addr_efa://[%s]:%d:%d", net.IP(b[0:16]),
			binary.LittleEndian.Uint16(b[16:18]), binary.LittleEndian.Uint32(b[20:24]))
	case a.Format == AddrStr:
		for i, c := range b {
			if c == 0 {
				return string(b[:i])
			}
		}
		return string(b)
	}
	return "0x" + hex.EncodeToString(b)
}

// MarshalJSON encodes the address with its printed form and raw bytes.
func (a Addr) MarshalJSON() ([]byte, error) {
	if len(a.Bytes) == 0 {
		return []byte("null"), nil
	}
	return json.Marshal(struct {
		Len int    `json:"len"`
		Str string `json:"str"`
		Hex string `json:"hex"`
	}{len(a.Bytes), a.String(), hex.EncodeToString(a.Bytes)})
}

// UnmarshalJSON decodes the raw bytes from "hex"; the format comes from the
// enclosing Info.
func (a *Addr) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*a = Addr{}
		return nil
	}
	var v struct {
		Hex string `json:"hex"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	raw, err := hex.DecodeString(v.Hex)
	if err != nil {
		return fmt.Errorf("address hex: %w", err)
	}
	a.Bytes = raw
	return nil
}

// TxAttr is fi_tx_attr.
type TxAttr struct {
	Caps        Caps      `json:"caps"`
	Mode        Mode      `json:"mode"`
	OpFlags     OpFlags   `json:"op_flags"`
	MsgOrder    MsgOrder  `json:"msg_order"`
	CompOrder   CompOrder `json:"comp_order"`
	InjectSize  uint64    `json:"inject_size"`
	Size        uint64    `json:"size"`
	IOVLimit    uint64    `json:"iov_limit"`
	RMAIOVLimit uint64    `json:"rma_iov_limit"`
	TClass      uint32    `json:"tclass"`
}

// RxAttr is fi_rx_attr.
type RxAttr struct {
	Caps              Caps      `json:"caps"`
	Mode              Mode      `json:"mode"`
	OpFlags           OpFlags   `json:"op_flags"`
	MsgOrder          MsgOrder  `json:"msg_order"`
	CompOrder         CompOrder `json:"comp_order"`
	TotalBufferedRecv uint64    `json:"total_buffered_recv"`
	Size              uint64    `json:"size"`
	IOVLimit          uint64    `json:"iov_limit"`
}

// EPAttr is fi_ep_attr.
type EPAttr struct {
	Type            EPType   `json:"type"`
	Protocol        Protocol `json:"protocol"`
	ProtocolVersion uint32   `json:"protocol_version"`
	MaxMsgSize      uint64   `json:"max_msg_size"`
	MsgPrefixSize   uint64   `json:"msg_prefix_size"`
	MaxOrderRAWSize uint64   `json:"max_order_raw_size"`
	MaxOrderWARSize uint64   `json:"max_order_war_size"`
	MaxOrderWAWSize uint64   `json:"max_order_waw_size"`
	MemTagFormat    uint64   `json:"mem_tag_format"`
	TxCtxCnt        uint64   `json:"tx_ctx_cnt"`
	RxCtxCnt        uint64   `json:"rx_ctx_cnt"`
	AuthKeySize     uint64   `json:"auth_key_size"`
}

// DomainAttr is fi_domain_attr. MaxEPAuthKey and MaxGroupID exist from
// libfabric 2.0 and are zero on 1.x.
type DomainAttr struct {
	Name            string       `json:"name"`
	Threading       Threading    `json:"threading"`
	ControlProgress Progress     `json:"control_progress"`
	DataProgress    Progress     `json:"data_progress"`
	ResourceMgmt    ResourceMgmt `json:"resource_mgmt"`
	AVType          AVType       `json:"av_type"`
	MRMode          MRMode       `json:"mr_mode"`
	MRKeySize       uint64       `json:"mr_key_size"`
	CQDataSize      uint64       `json:"cq_data_size"`
	CQCnt           uint64       `json:"cq_cnt"`
	EPCnt           uint64       `json:"ep_cnt"`
	TxCtxCnt        uint64       `json:"tx_ctx_cnt"`
	RxCtxCnt        uint64       `json:"rx_ctx_cnt"`
	MaxEPTxCtx      uint64       `json:"max_ep_tx_ctx"`
	MaxEPRxCtx      uint64       `json:"max_ep_rx_ctx"`
	MaxEPStxCtx     uint64       `json:"max_ep_stx_ctx"`
	MaxEPSrxCtx     uint64       `json:"max_ep_srx_ctx"`
	CntrCnt         uint64       `json:"cntr_cnt"`
	MRIOVLimit      uint64       `json:"mr_iov_limit"`
	Caps            Caps         `json:"caps"`
	Mode            Mode         `json:"mode"`
	AuthKeySize     uint64       `json:"auth_key_size"`
	MaxErrData      uint64       `json:"max_err_data"`
	MRCnt           uint64       `json:"mr_cnt"`
	TClass          uint32       `json:"tclass"`
	MaxEPAuthKey    uint64       `json:"max_ep_auth_key"`
	MaxGroupID      uint32       `json:"max_group_id"`
}

// FabricAttr is fi_fabric_attr.
type FabricAttr struct {
	Name        string  `json:"name"`
	ProvName    string  `json:"prov_name"`
	ProvVersion Version `json:"prov_version"`
	APIVersion  Version `json:"api_version"`
}

// NIC is fid_nic: the hardware behind a domain, when the provider says.
type NIC struct {
	Device *DeviceAttr `json:"device_attr,omitempty"`
	Bus    *BusAttr    `json:"bus_attr,omitempty"`
	Link   *LinkAttr   `json:"link_attr,omitempty"`
}

// DeviceAttr is fi_device_attr.
type DeviceAttr struct {
	Name          string `json:"name"`
	DeviceID      string `json:"device_id"`
	DeviceVersion string `json:"device_version"`
	VendorID      string `json:"vendor_id"`
	Driver        string `json:"driver"`
	Firmware      string `json:"firmware"`
}

// BusAttr is fi_bus_attr; PCI is set for FI_BUS_PCI.
type BusAttr struct {
	Type BusType  `json:"bus_type"`
	PCI  *PCIAttr `json:"pci,omitempty"`
}

// PCIAttr is fi_pci_attr.
type PCIAttr struct {
	DomainID   uint16 `json:"domain_id"`
	BusID      uint8  `json:"bus_id"`
	DeviceID   uint8  `json:"device_id"`
	FunctionID uint8  `json:"function_id"`
}

// LinkAttr is fi_link_attr.
type LinkAttr struct {
	Address     string    `json:"address"`
	MTU         uint64    `json:"mtu"`
	Speed       uint64    `json:"speed"`
	State       LinkState `json:"state"`
	NetworkType string    `json:"network_type"`
}

// UnmarshalJSON decodes an Info and gives its addresses the Info's format.
func (i *Info) UnmarshalJSON(b []byte) error {
	type plain Info
	if err := json.Unmarshal(b, (*plain)(i)); err != nil {
		return err
	}
	i.SrcAddr.Format, i.DestAddr.Format = i.AddrFormat, i.AddrFormat
	return nil
}

// Provider is the provider name as fi_info prints it ("tcp;ofi_rxm").
func (i *Info) Provider() string { return i.Fabric.ProvName }

// Verbose is the fi_info -v text of this Info: libfabric's own fi_tostr
// rendering, captured when the Info came from fi_getinfo, or produced by
// libfabric from the Go values for an Info built in Go (which then has no
// nic). It ends with a newline.
func (i *Info) Verbose() string {
	if i.tostr != "" {
		return i.tostr
	}
	return tostrInfo(i)
}
