package ofi

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The flag and enum types below carry libfabric's bit values (ABI, the same
// in 1.17 and 2.x unless noted) and print with libfabric's names. String
// joins set flags with " | "; JSON encodes a flag set as an array of names
// and an enum as its name, so the output of `fitransfer info --json` is
// readable and stable.

// Caps is a set of capability bits (fi_info.caps, tx/rx/domain caps).
type Caps uint64

// Mode is a set of mode bits the provider requires of the application.
type Mode uint64

// OpFlags is a set of operation flags (tx_attr.op_flags, per-op flags).
type OpFlags uint64

// MsgOrder is a set of message ordering guarantees (FI_ORDER_*).
type MsgOrder uint64

// OrderRAR is FI_ORDER_RAR: reads complete at the target in the order
// they were posted.
const OrderRAR MsgOrder = 1 << 0

// CompOrder is a set of completion ordering guarantees.
type CompOrder uint64

// MRMode is the set of memory registration mode bits (domain_attr.mr_mode).
type MRMode uint32

// Capability bits (fabric.h).
const (
	CapMsg          Caps = 1 << 1
	CapRMA          Caps = 1 << 2
	CapTagged       Caps = 1 << 3
	CapAtomic       Caps = 1 << 4
	CapMulticast    Caps = 1 << 5
	CapCollective   Caps = 1 << 6
	CapRead         Caps = 1 << 8
	CapWrite        Caps = 1 << 9
	CapRecv         Caps = 1 << 10
	CapSend         Caps = 1 << 11
	CapRemoteRead   Caps = 1 << 12
	CapRemoteWrite  Caps = 1 << 13
	CapMultiRecv    Caps = 1 << 16
	CapRemoteCQData Caps = 1 << 17
	CapTrigger      Caps = 1 << 20
	CapFence        Caps = 1 << 21
	CapAVUserID     Caps = 1 << 41
	CapPeer         Caps = 1 << 43
	CapHMEM         Caps = 1 << 47
	CapRMAPMem      Caps = 1 << 49
	CapSourceErr    Caps = 1 << 50
	CapLocalComm    Caps = 1 << 51
	CapRemoteComm   Caps = 1 << 52
	CapSharedAV     Caps = 1 << 53
	CapRMAEvent     Caps = 1 << 56
	CapSource       Caps = 1 << 57
	CapNamedRxCtx   Caps = 1 << 58
	CapDirectedRecv Caps = 1 << 59
)

// Operation flag bits (fabric.h).
const (
	OpMulticast        OpFlags = 1 << 5
	OpMultiRecv        OpFlags = 1 << 16
	OpRemoteCQData     OpFlags = 1 << 17
	OpMore             OpFlags = 1 << 18
	OpPeek             OpFlags = 1 << 19
	OpTrigger          OpFlags = 1 << 20
	OpFence            OpFlags = 1 << 21
	OpCompletion       OpFlags = 1 << 24
	OpInject           OpFlags = 1 << 25
	OpInjectComplete   OpFlags = 1 << 26
	OpTransmitComplete OpFlags = 1 << 27
	OpDeliveryComplete OpFlags = 1 << 28
	OpAffinity         OpFlags = 1 << 29
	OpCommitComplete   OpFlags = 1 << 30
	OpMatchComplete    OpFlags = 1 << 31
	OpDiscard          OpFlags = 1 << 58
	OpClaim            OpFlags = 1 << 59
)

// Mode bits (fabric.h).
const (
	ModeContext      Mode = 1 << 59
	ModeMsgPrefix    Mode = 1 << 58
	ModeAsyncIOV     Mode = 1 << 57
	ModeRxCQData     Mode = 1 << 56
	ModeLocalMR      Mode = 1 << 55
	ModeContext2     Mode = 1 << 52
	ModeBufferedRecv Mode = 1 << 51 // 1.x only
)

// Memory registration mode bits (fabric.h).
const (
	MRBasic      MRMode = 1 << 0 // deprecated
	MRScalable   MRMode = 1 << 1 // deprecated
	MRLocal      MRMode = 1 << 2
	MRRaw        MRMode = 1 << 3
	MRVirtAddr   MRMode = 1 << 4
	MRAllocated  MRMode = 1 << 5
	MRProvKey    MRMode = 1 << 6
	MRMMUNotify  MRMode = 1 << 7
	MRRMAEvent   MRMode = 1 << 8
	MREndpoint   MRMode = 1 << 9
	MRHMEM       MRMode = 1 << 10
	MRCollective MRMode = 1 << 11
)

// getinfo flags (fabric.h) that fitransfer passes to fi_getinfo.
const (
	GetInfoProvAttrOnly uint64 = 1 << 54 // FI_PROV_ATTR_ONLY
	GetInfoNumericHost  uint64 = 1 << 55 // FI_NUMERICHOST
	GetInfoSource       uint64 = 1 << 57 // FI_SOURCE
)

type flagName struct {
	bit  uint64
	name string
}

// capNames is in libfabric's fi_tostr order. Bits 45, 46 and 48 changed
// meaning in 2.0; they are named for the loaded library (see init).
var capNames = []flagName{
	{1 << 1, "FI_MSG"}, {1 << 2, "FI_RMA"}, {1 << 3, "FI_TAGGED"}, {1 << 4, "FI_ATOMIC"},
	{1 << 5, "FI_MULTICAST"}, {1 << 6, "FI_COLLECTIVE"},
	{1 << 8, "FI_READ"}, {1 << 9, "FI_WRITE"}, {1 << 10, "FI_RECV"}, {1 << 11, "FI_SEND"},
	{1 << 12, "FI_REMOTE_READ"}, {1 << 13, "FI_REMOTE_WRITE"},
	{1 << 16, "FI_MULTI_RECV"}, {1 << 17, "FI_REMOTE_CQ_DATA"}, {1 << 20, "FI_TRIGGER"}, {1 << 21, "FI_FENCE"},
	{1 << 48, "FI_VARIABLE_MSG"}, {1 << 49, "FI_RMA_PMEM"}, {1 << 50, "FI_SOURCE_ERR"},
	{1 << 51, "FI_LOCAL_COMM"}, {1 << 52, "FI_REMOTE_COMM"}, {1 << 53, "FI_SHARED_AV"},
	{1 << 56, "FI_RMA_EVENT"}, {1 << 57, "FI_SOURCE"}, {1 << 58, "FI_NAMED_RX_CTX"},
	{1 << 59, "FI_DIRECTED_RECV"}, {1 << 41, "FI_AV_USER_ID"}, {1 << 43, "FI_PEER"},
	{1 << 47, "FI_HMEM"},
}

var capNames2x = []flagName{
	{1 << 45, "FI_TAGGED_DIRECTED_RECV"}, {1 << 46, "FI_TAGGED_MULTI_RECV"},
	{1 << 48, "FI_EXACT_DIRECTED_RECV"},
}

// modeBits1x are mode bits that 2.0 removed.
const modeBits1x = 1<<54 | 1<<53 | 1<<51

var opFlagNames = []flagName{
	{1 << 5, "FI_MULTICAST"}, {1 << 16, "FI_MULTI_RECV"}, {1 << 17, "FI_REMOTE_CQ_DATA"},
	{1 << 18, "FI_MORE"}, {1 << 19, "FI_PEEK"}, {1 << 20, "FI_TRIGGER"}, {1 << 21, "FI_FENCE"},
	{1 << 24, "FI_COMPLETION"}, {1 << 25, "FI_INJECT"}, {1 << 26, "FI_INJECT_COMPLETE"},
	{1 << 27, "FI_TRANSMIT_COMPLETE"}, {1 << 28, "FI_DELIVERY_COMPLETE"},
	{1 << 31, "FI_MATCH_COMPLETE"}, {1 << 29, "FI_AFFINITY"}, {1 << 30, "FI_COMMIT_COMPLETE"},
	{1 << 59, "FI_CLAIM"}, {1 << 58, "FI_DISCARD"},
}

var modeNames = []flagName{
	{1 << 59, "FI_CONTEXT"}, {1 << 58, "FI_MSG_PREFIX"}, {1 << 57, "FI_ASYNC_IOV"},
	{1 << 56, "FI_RX_CQ_DATA"}, {1 << 55, "FI_LOCAL_MR"}, {1 << 54, "FI_NOTIFY_FLAGS_ONLY"},
	{1 << 53, "FI_RESTRICTED_COMP"}, {1 << 52, "FI_CONTEXT2"}, {1 << 51, "FI_BUFFERED_RECV"},
}

var msgOrderNames = []flagName{
	{1 << 0, "FI_ORDER_RAR"}, {1 << 1, "FI_ORDER_RAW"}, {1 << 2, "FI_ORDER_RAS"},
	{1 << 3, "FI_ORDER_WAR"}, {1 << 4, "FI_ORDER_WAW"}, {1 << 5, "FI_ORDER_WAS"},
	{1 << 6, "FI_ORDER_SAR"}, {1 << 7, "FI_ORDER_SAW"}, {1 << 8, "FI_ORDER_SAS"},
	{1 << 32, "FI_ORDER_RMA_RAR"}, {1 << 33, "FI_ORDER_RMA_RAW"}, {1 << 34, "FI_ORDER_RMA_WAR"},
	{1 << 35, "FI_ORDER_RMA_WAW"}, {1 << 36, "FI_ORDER_ATOMIC_RAR"}, {1 << 37, "FI_ORDER_ATOMIC_RAW"},
	{1 << 38, "FI_ORDER_ATOMIC_WAR"}, {1 << 39, "FI_ORDER_ATOMIC_WAW"},
}

var compOrderNames = []flagName{{0x1FF, "FI_ORDER_STRICT"}, {1 << 16, "FI_ORDER_DATA"}}

var mrModeNames = []flagName{
	{1 << 0, "FI_MR_BASIC"}, {1 << 1, "FI_MR_SCALABLE"}, {1 << 2, "FI_MR_LOCAL"}, {1 << 3, "FI_MR_RAW"},
	{1 << 4, "FI_MR_VIRT_ADDR"}, {1 << 5, "FI_MR_ALLOCATED"}, {1 << 6, "FI_MR_PROV_KEY"},
	{1 << 7, "FI_MR_MMU_NOTIFY"}, {1 << 8, "FI_MR_RMA_EVENT"}, {1 << 9, "FI_MR_ENDPOINT"},
	{1 << 10, "FI_MR_HMEM"}, {1 << 11, "FI_MR_COLLECTIVE"},
}

func init() {
	// Name the bits whose meaning changed in libfabric 2.0 after the
	// library actually loaded, so printed names match what fi_info says.
	if RuntimeVersion().Major() >= 2 {
		capNames = mergeNames(capNames, capNames2x)
		var kept []flagName
		for _, f := range modeNames {
			if f.bit&modeBits1x == 0 {
				kept = append(kept, f)
			}
		}
		modeNames = kept
	}
}

// mergeNames replaces entries of base whose bit appears in over and appends
// the rest of over.
func mergeNames(base, over []flagName) []flagName {
	out := make([]flagName, 0, len(base)+len(over))
	for _, b := range base {
		replaced := false
		for _, o := range over {
			if o.bit == b.bit {
				replaced = true
			}
		}
		if !replaced {
			out = append(out, b)
		}
	}
	return append(out, over...)
}

// flagList names the bits of v in table order; bits without a name are
// listed as one hex value at the end.
func flagList(v uint64, table []flagName) []string {
	var out []string
	var known uint64
	for _, f := range table {
		if v&f.bit == f.bit && f.bit != 0 {
			out = append(out, f.name)
			known |= f.bit
		}
	}
	if rest := v &^ known; rest != 0 {
		out = append(out, fmt.Sprintf("0x%x", rest))
	}
	return out
}

func flagString(v uint64, table []flagName) string {
	if v == 0 {
		return "0"
	}
	return strings.Join(flagList(v, table), " | ")
}

// parseFlags parses names joined by '|' (case-insensitive, spaces allowed,
// "FI_" prefix optional). The error names the bad token and the valid ones.
func parseFlags(s, what string, table []flagName) (uint64, error) {
	var v uint64
	for _, tok := range strings.Split(s, "|") {
		tok = strings.ToUpper(strings.TrimSpace(tok))
		if tok == "" {
			continue
		}
		if !strings.HasPrefix(tok, "FI_") {
			tok = "FI_" + tok
		}
		found := false
		for _, f := range table {
			if f.name == tok {
				v |= f.bit
				found = true
				break
			}
		}
		if !found {
			return 0, &BadNameError{What: what, Name: strings.TrimSpace(tok), Valid: names(table)}
		}
	}
	return v, nil
}

func names(table []flagName) []string {
	out := make([]string, len(table))
	for i, f := range table {
		out[i] = f.name
	}
	return out
}

// BadNameError is a flag or enum name that libfabric does not define.
type BadNameError struct {
	What  string   // "capability", "endpoint type", ...
	Name  string   // the rejected token
	Valid []string // every accepted name
}

func (e *BadNameError) Error() string {
	return fmt.Sprintf("unknown %s %q; valid: %s", e.What, e.Name, strings.Join(e.Valid, ", "))
}

func marshalFlags(v uint64, table []flagName) ([]byte, error) {
	l := flagList(v, table)
	if l == nil {
		l = []string{}
	}
	return json.Marshal(l)
}

func unmarshalFlags(b []byte, what string, table []flagName) (uint64, error) {
	var l []string
	if err := json.Unmarshal(b, &l); err != nil {
		return 0, err
	}
	var v uint64
	for _, n := range l {
		if strings.HasPrefix(n, "0x") {
			var x uint64
			if _, err := fmt.Sscanf(n, "0x%x", &x); err != nil {
				return 0, fmt.Errorf("bad %s bits %q", what, n)
			}
			v |= x
			continue
		}
		x, err := parseFlags(n, what, table)
		if err != nil {
			return 0, err
		}
		v |= x
	}
	return v, nil
}

// String prints the set as "FI_MSG | FI_RMA".
func (c Caps) String() string { return flagString(uint64(c), capNames) }

// Names lists the set bits by name, in libfabric's order.
func (c Caps) Names() []string { return flagList(uint64(c), capNames) }

// Has reports whether every bit of want is set.
func (c Caps) Has(want Caps) bool { return c&want == want }

// MarshalJSON encodes the set as an array of names.
func (c Caps) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(c), capNames) }

// UnmarshalJSON decodes an array of names.
func (c *Caps) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "capability", capNames)
	*c = Caps(v)
	return err
}

// ParseCaps parses "FI_MSG|FI_RMA" as fi_info -c does.
func ParseCaps(s string) (Caps, error) {
	v, err := parseFlags(s, "capability", capNames)
	return Caps(v), err
}

// String prints the set as "FI_CONTEXT | FI_CONTEXT2".
func (m Mode) String() string { return flagString(uint64(m), modeNames) }

// Names lists the set bits by name.
func (m Mode) Names() []string { return flagList(uint64(m), modeNames) }

// MarshalJSON encodes the set as an array of names.
func (m Mode) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(m), modeNames) }

// UnmarshalJSON decodes an array of names.
func (m *Mode) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "mode", modeNames)
	*m = Mode(v)
	return err
}

// ParseMode parses "FI_CONTEXT|FI_CONTEXT2" as fi_info -m does.
func ParseMode(s string) (Mode, error) {
	v, err := parseFlags(s, "mode", modeNames)
	return Mode(v), err
}

// String prints the set as "FI_COMPLETION | FI_DELIVERY_COMPLETE".
func (o OpFlags) String() string { return flagString(uint64(o), opFlagNames) }

// MarshalJSON encodes the set as an array of names.
func (o OpFlags) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(o), opFlagNames) }

// UnmarshalJSON decodes an array of names.
func (o *OpFlags) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "op flag", opFlagNames)
	*o = OpFlags(v)
	return err
}

// String prints the set as "FI_ORDER_RAR | FI_ORDER_RAW".
func (o MsgOrder) String() string { return flagString(uint64(o), msgOrderNames) }

// MarshalJSON encodes the set as an array of names.
func (o MsgOrder) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(o), msgOrderNames) }

// UnmarshalJSON decodes an array of names.
func (o *MsgOrder) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "message order", msgOrderNames)
	*o = MsgOrder(v)
	return err
}

// String prints the set; 0 is FI_ORDER_NONE.
func (o CompOrder) String() string {
	if o == 0 {
		return "FI_ORDER_NONE"
	}
	return flagString(uint64(o), compOrderNames)
}

// MarshalJSON encodes the set as an array of names.
func (o CompOrder) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(o), compOrderNames) }

// UnmarshalJSON decodes an array of names.
func (o *CompOrder) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "completion order", compOrderNames)
	*o = CompOrder(v)
	return err
}

// String prints the set as "FI_MR_LOCAL | FI_MR_VIRT_ADDR".
func (m MRMode) String() string { return flagString(uint64(m), mrModeNames) }

// Names lists the set bits by name.
func (m MRMode) Names() []string { return flagList(uint64(m), mrModeNames) }

// Has reports whether every bit of want is set.
func (m MRMode) Has(want MRMode) bool { return m&want == want }

// MarshalJSON encodes the set as an array of names.
func (m MRMode) MarshalJSON() ([]byte, error) { return marshalFlags(uint64(m), mrModeNames) }

// UnmarshalJSON decodes an array of names.
func (m *MRMode) UnmarshalJSON(b []byte) error {
	v, err := unmarshalFlags(b, "mr mode", mrModeNames)
	*m = MRMode(v)
	return err
}
