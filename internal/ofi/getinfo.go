package ofi

/*
#include "ofi.h"
*/
import "C"

import "unsafe"

// GetInfo calls fi_getinfo for the given API version and converts every
// returned fi_info to a Go value. node and service may be empty; flags are
// fi_getinfo flags (GetInfoSource, GetInfoProvAttrOnly, ...); hints may be
// nil, which passes NULL as fi_info does without filters.
func GetInfo(version Version, node, service string, flags uint64, hints *Info) ([]Info, error) {
	var cnode, cservice *C.char
	if node != "" {
		cnode = C.CString(node)
		defer C.free(unsafe.Pointer(cnode))
	}
	if service != "" {
		cservice = C.CString(service)
		defer C.free(unsafe.Pointer(cservice))
	}
	var chints *C.struct_fi_info
	if hints != nil {
		h, err := toC(hints)
		if err != nil {
			return nil, err
		}
		defer C.fi_freeinfo(h)
		chints = h
	}
	var list *C.struct_fi_info
	var rc C.int
	initialize(func() { rc = C.fi_getinfo(C.uint32_t(version), cnode, cservice, C.uint64_t(flags), chints, &list) })
	if err := check("fi_getinfo", rc); err != nil {
		return nil, err
	}
	defer C.fi_freeinfo(list)
	var out []Info
	for cur := list; cur != nil; cur = cur.next {
		out = append(out, fromC(cur, flags&GetInfoProvAttrOnly == 0))
	}
	return out, nil
}

func goString(s *C.char) string {
	if s == nil {
		return ""
	}
	return C.GoString(s)
}

func cString(s string) *C.char {
	if s == "" {
		return nil
	}
	return C.CString(s) // malloc'd: fi_freeinfo frees it
}

func addrFromC(format C.uint32_t, p unsafe.Pointer, n C.size_t) Addr {
	a := Addr{Format: AddrFormat(format)}
	if p != nil && n > 0 {
		a.Bytes = C.GoBytes(p, C.int(n))
	}
	return a
}

// fromC converts one fi_info (not the list behind it). withText captures
// libfabric's fi_tostr rendering for Verbose.
func fromC(ci *C.struct_fi_info, withText bool) Info {
	i := Info{
		Caps:       Caps(ci.caps),
		Mode:       Mode(ci.mode),
		AddrFormat: AddrFormat(ci.addr_format),
		SrcAddr:    addrFromC(ci.addr_format, ci.src_addr, ci.src_addrlen),
		DestAddr:   addrFromC(ci.addr_format, ci.dest_addr, ci.dest_addrlen),
	}
	if t := ci.tx_attr; t != nil {
		i.Tx = TxAttr{
			Caps: Caps(t.caps), Mode: Mode(t.mode), OpFlags: OpFlags(t.op_flags),
			MsgOrder: MsgOrder(t.msg_order), CompOrder: CompOrder(t.comp_order),
			InjectSize: uint64(t.inject_size), Size: uint64(t.size),
			IOVLimit: uint64(t.iov_limit), RMAIOVLimit: uint64(t.rma_iov_limit),
			TClass: uint32(t.tclass),
		}
	}
	if r := ci.rx_attr; r != nil {
		i.Rx = RxAttr{
			Caps: Caps(r.caps), Mode: Mode(r.mode), OpFlags: OpFlags(r.op_flags),
			MsgOrder: MsgOrder(r.msg_order), CompOrder: CompOrder(r.comp_order),
			TotalBufferedRecv: uint64(r.total_buffered_recv), Size: uint64(r.size),
			IOVLimit: uint64(r.iov_limit),
		}
	}
	if e := ci.ep_attr; e != nil {
		i.EP = EPAttr{
			Type: EPType(e._type), Protocol: Protocol(e.protocol),
			ProtocolVersion: uint32(e.protocol_version), MaxMsgSize: uint64(e.max_msg_size),
			MsgPrefixSize:   uint64(e.msg_prefix_size),
			MaxOrderRAWSize: uint64(e.max_order_raw_size), MaxOrderWARSize: uint64(e.max_order_war_size),
			MaxOrderWAWSize: uint64(e.max_order_waw_size), MemTagFormat: uint64(e.mem_tag_format),
			TxCtxCnt: uint64(e.tx_ctx_cnt), RxCtxCnt: uint64(e.rx_ctx_cnt),
			AuthKeySize: uint64(e.auth_key_size),
		}
	}
	if d := ci.domain_attr; d != nil {
		i.Domain = DomainAttr{
			Name: goString(d.name), Threading: Threading(d.threading),
			ControlProgress: Progress(d.control_progress),
			DataProgress:    Progress(C.ft_domain_data_progress(d)),
			ResourceMgmt:    ResourceMgmt(d.resource_mgmt), AVType: AVType(d.av_type),
			MRMode: MRMode(uint32(d.mr_mode)), MRKeySize: uint64(d.mr_key_size),
			CQDataSize: uint64(d.cq_data_size), CQCnt: uint64(d.cq_cnt), EPCnt: uint64(d.ep_cnt),
			TxCtxCnt: uint64(d.tx_ctx_cnt), RxCtxCnt: uint64(d.rx_ctx_cnt),
			MaxEPTxCtx: uint64(d.max_ep_tx_ctx), MaxEPRxCtx: uint64(d.max_ep_rx_ctx),
			MaxEPStxCtx: uint64(d.max_ep_stx_ctx), MaxEPSrxCtx: uint64(d.max_ep_srx_ctx),
			CntrCnt: uint64(d.cntr_cnt), MRIOVLimit: uint64(d.mr_iov_limit),
			Caps: Caps(d.caps), Mode: Mode(d.mode), AuthKeySize: uint64(d.auth_key_size),
			MaxErrData: uint64(d.max_err_data), MRCnt: uint64(d.mr_cnt), TClass: uint32(d.tclass),
			MaxEPAuthKey: uint64(C.ft_domain_max_ep_auth_key(d)),
			MaxGroupID:   uint32(C.ft_domain_max_group_id(d)),
		}
	}
	if f := ci.fabric_attr; f != nil {
		i.Fabric = FabricAttr{
			Name: goString(f.name), ProvName: goString(f.prov_name),
			ProvVersion: Version(f.prov_version), APIVersion: Version(f.api_version),
		}
	}
	if n := ci.nic; n != nil {
		i.NIC = nicFromC(n)
	}
	if withText {
		if s := C.ft_info_tostr(ci); s != nil {
			i.tostr = C.GoString(s)
			C.free(unsafe.Pointer(s))
		}
	}
	return i
}

func nicFromC(n *C.struct_fid_nic) *NIC {
	out := &NIC{}
	if d := n.device_attr; d != nil {
		out.Device = &DeviceAttr{
			Name: goString(d.name), DeviceID: goString(d.device_id),
			DeviceVersion: goString(d.device_version), VendorID: goString(d.vendor_id),
			Driver: goString(d.driver), Firmware: goString(d.firmware),
		}
	}
	if b := n.bus_attr; b != nil {
		out.Bus = &BusAttr{Type: BusType(b.bus_type)}
		if out.Bus.Type == 1 {
			p := C.ft_bus_pci(b)
			out.Bus.PCI = &PCIAttr{DomainID: uint16(p.domain_id), BusID: uint8(p.bus_id),
				DeviceID: uint8(p.device_id), FunctionID: uint8(p.function_id)}
		}
	}
	if l := n.link_attr; l != nil {
		out.Link = &LinkAttr{Address: goString(l.address), MTU: uint64(l.mtu),
			Speed: uint64(l.speed), State: LinkState(l.state), NetworkType: goString(l.network_type)}
	}
	return out
}

// toC builds a C fi_info from a Go Info (without nic). The caller frees it
// with fi_freeinfo, which also frees the strings and addresses.
func toC(i *Info) (*C.struct_fi_info, error) {
	ci := C.fi_allocinfo()
	if ci == nil {
		return nil, &CallError{Call: "fi_allocinfo", Errno: ErrNoMem}
	}
	ci.caps = C.uint64_t(i.Caps)
	ci.mode = C.uint64_t(i.Mode)
	ci.addr_format = C.uint32_t(i.AddrFormat)
	ci.src_addr, ci.src_addrlen = cBytes(i.SrcAddr.Bytes)
	ci.dest_addr, ci.dest_addrlen = cBytes(i.DestAddr.Bytes)

	t := ci.tx_attr
	t.caps, t.mode, t.op_flags = C.uint64_t(i.Tx.Caps), C.uint64_t(i.Tx.Mode), C.uint64_t(i.Tx.OpFlags)
	t.msg_order, t.comp_order = C.uint64_t(i.Tx.MsgOrder), C.uint64_t(i.Tx.CompOrder)
	t.inject_size, t.size = C.size_t(i.Tx.InjectSize), C.size_t(i.Tx.Size)
	t.iov_limit, t.rma_iov_limit = C.size_t(i.Tx.IOVLimit), C.size_t(i.Tx.RMAIOVLimit)
	t.tclass = C.uint32_t(i.Tx.TClass)

	r := ci.rx_attr
	r.caps, r.mode, r.op_flags = C.uint64_t(i.Rx.Caps), C.uint64_t(i.Rx.Mode), C.uint64_t(i.Rx.OpFlags)
	r.msg_order, r.comp_order = C.uint64_t(i.Rx.MsgOrder), C.uint64_t(i.Rx.CompOrder)
	r.total_buffered_recv, r.size = C.size_t(i.Rx.TotalBufferedRecv), C.size_t(i.Rx.Size)
	r.iov_limit = C.size_t(i.Rx.IOVLimit)

	e := ci.ep_attr
	e._type, e.protocol, e.protocol_version = C.enum_fi_ep_type(i.EP.Type), C.uint32_t(i.EP.Protocol), C.uint32_t(i.EP.ProtocolVersion)
	e.max_msg_size, e.msg_prefix_size = C.size_t(i.EP.MaxMsgSize), C.size_t(i.EP.MsgPrefixSize)
	e.max_order_raw_size, e.max_order_war_size = C.size_t(i.EP.MaxOrderRAWSize), C.size_t(i.EP.MaxOrderWARSize)
	e.max_order_waw_size, e.mem_tag_format = C.size_t(i.EP.MaxOrderWAWSize), C.uint64_t(i.EP.MemTagFormat)
	e.tx_ctx_cnt, e.rx_ctx_cnt = C.size_t(i.EP.TxCtxCnt), C.size_t(i.EP.RxCtxCnt)
	e.auth_key_size = C.size_t(i.EP.AuthKeySize)

	d := ci.domain_attr
	d.name = cString(i.Domain.Name)
	d.threading = C.enum_fi_threading(i.Domain.Threading)
	d.control_progress = C.enum_fi_progress(i.Domain.ControlProgress)
	C.ft_domain_set_data_progress(d, C.enum_fi_progress(i.Domain.DataProgress))
	d.resource_mgmt = C.enum_fi_resource_mgmt(i.Domain.ResourceMgmt)
	d.av_type = C.enum_fi_av_type(i.Domain.AVType)
	d.mr_mode = C.int(int32(i.Domain.MRMode))
	d.mr_key_size, d.cq_data_size = C.size_t(i.Domain.MRKeySize), C.size_t(i.Domain.CQDataSize)
	d.cq_cnt, d.ep_cnt = C.size_t(i.Domain.CQCnt), C.size_t(i.Domain.EPCnt)
	d.tx_ctx_cnt, d.rx_ctx_cnt = C.size_t(i.Domain.TxCtxCnt), C.size_t(i.Domain.RxCtxCnt)
	d.max_ep_tx_ctx, d.max_ep_rx_ctx = C.size_t(i.Domain.MaxEPTxCtx), C.size_t(i.Domain.MaxEPRxCtx)
	d.max_ep_stx_ctx, d.max_ep_srx_ctx = C.size_t(i.Domain.MaxEPStxCtx), C.size_t(i.Domain.MaxEPSrxCtx)
	d.cntr_cnt, d.mr_iov_limit = C.size_t(i.Domain.CntrCnt), C.size_t(i.Domain.MRIOVLimit)
	d.caps, d.mode = C.uint64_t(i.Domain.Caps), C.uint64_t(i.Domain.Mode)
	d.auth_key_size, d.max_err_data = C.size_t(i.Domain.AuthKeySize), C.size_t(i.Domain.MaxErrData)
	d.mr_cnt, d.tclass = C.size_t(i.Domain.MRCnt), C.uint32_t(i.Domain.TClass)
	C.ft_domain_set_2x(d, C.size_t(i.Domain.MaxEPAuthKey), C.uint32_t(i.Domain.MaxGroupID))

	f := ci.fabric_attr
	f.name, f.prov_name = cString(i.Fabric.Name), cString(i.Fabric.ProvName)
	f.prov_version, f.api_version = C.uint32_t(i.Fabric.ProvVersion), C.uint32_t(i.Fabric.APIVersion)
	return ci, nil
}

func cBytes(b []byte) (unsafe.Pointer, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return C.CBytes(b), C.size_t(len(b))
}

// tostrInfo renders a Go-built Info with libfabric's fi_tostr.
func tostrInfo(i *Info) string {
	ci, err := toC(i)
	if err != nil {
		return ""
	}
	defer C.fi_freeinfo(ci)
	s := C.ft_info_tostr(ci)
	if s == nil {
		return ""
	}
	defer C.free(unsafe.Pointer(s))
	return C.GoString(s)
}

// TypeString is libfabric's fi_tostr text for a single enum value of the
// given fi_type (e.g. an endpoint type), as fi_info prints it.
func typeString(v uint32, typ C.enum_fi_type) string {
	var buf [256]C.char
	x := C.uint32_t(v)
	return C.GoString(C.fi_tostr_r(&buf[0], C.size_t(len(buf)), unsafe.Pointer(&x), typ))
}

// EPTypeText is fi_tostr(FI_TYPE_EP_TYPE) of t.
func EPTypeText(t EPType) string { return typeString(uint32(t), C.FI_TYPE_EP_TYPE) }

// ProtocolText is fi_tostr(FI_TYPE_PROTOCOL) of p.
func ProtocolText(p Protocol) string { return typeString(uint32(p), C.FI_TYPE_PROTOCOL) }
