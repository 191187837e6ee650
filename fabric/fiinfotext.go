package fabric

import (
	"bufio"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// ParseFiInfoText reads fi_info's printed output back into Info values, so
// recorded outputs of machines fitransfer cannot run on (p4d, p5) drive
// its tests. It reads both forms:
//   - the short form of `fi_info [-p P]`: "provider:" lines, each followed
//     by fabric, domain, version, type and protocol;
//   - the verbose form of `fi_info -v` (fi_tostr's YAML, libfabric 1.17 and
//     2.x): caps, modes, every attribute group and the nic.
//
// Lines starting with '#' (notes) or "$ " (a shell prompt) are skipped, as
// are YAML document markers. Addresses and handles are not read back:
// fi_info prints them in forms that do not say their bytes. The short form
// carries no caps, so Infos read from it have none.
func ParseFiInfoText(text string) ([]Info, error) {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), " \t\r")
		if l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, "$ ") {
			continue
		}
		lines = append(lines, l)
	}
	for _, l := range lines {
		if l == "fi_info:" {
			return parseVerbose(lines)
		}
	}
	return parseShort(lines)
}

func parseShort(lines []string) ([]Info, error) {
	var out []Info
	for n, l := range lines {
		if l == "..." || l == "---" {
			continue
		}
		key, val, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			return nil, fmt.Errorf("fi_info line %d: %q is not \"key: value\"", n+1, l)
		}
		val = strings.TrimSpace(val)
		if key == "provider" {
			out = append(out, Info{})
			out[len(out)-1].Fabric.ProvName = val
			continue
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("fi_info line %d: %q before the first provider line", n+1, l)
		}
		in := &out[len(out)-1]
		var err error
		switch key {
		case "fabric":
			in.Fabric.Name = val
		case "domain":
			in.Domain.Name = val
		case "version":
			err = in.Fabric.ProvVersion.UnmarshalText([]byte(val))
		case "type":
			in.EP.Type, err = ParseEPType(val)
		case "protocol":
			err = json.Unmarshal([]byte(strconv.Quote(val)), &in.EP.Protocol)
		default:
			err = fmt.Errorf("unknown key %q", key)
		}
		if err != nil {
			return nil, fmt.Errorf("fi_info line %d: %w", n+1, err)
		}
	}
	return out, nil
}

// node is one "key: value" line of the verbose form and the lines indented
// under it.
type node struct {
	key, val string
	kids     []*node
}

func parseVerbose(lines []string) ([]Info, error) {
	var out []Info
	var doc *node
	type level struct {
		indent int
		n      *node
	}
	var stack []level
	flush := func() error {
		if doc == nil {
			return nil
		}
		in, err := infoFromNode(doc)
		if err != nil {
			return err
		}
		out = append(out, in)
		doc, stack = nil, nil
		return nil
	}
	for n, l := range lines {
		if l == "---" || l == "..." {
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		}
		indent := len(l) - len(strings.TrimLeft(l, " "))
		key, val, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			return nil, fmt.Errorf("fi_info -v line %d: %q is not \"key: value\"", n+1, l)
		}
		nd := &node{key: key, val: strings.TrimSpace(val)}
		if indent == 0 {
			if key != "fi_info" {
				return nil, fmt.Errorf("fi_info -v line %d: %q at the top level", n+1, l)
			}
			if err := flush(); err != nil {
				return nil, err
			}
			doc = nd
			stack = []level{{0, nd}}
			continue
		}
		for len(stack) > 0 && stack[len(stack)-1].indent >= indent {
			stack = stack[:len(stack)-1]
		}
		if len(stack) == 0 {
			return nil, fmt.Errorf("fi_info -v line %d: %q outside an fi_info", n+1, l)
		}
		parent := stack[len(stack)-1].n
		parent.kids = append(parent.kids, nd)
		stack = append(stack, level{indent, nd})
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// verboseKeys maps fi_tostr's group names to Info's JSON names; nil
// entries are not read back (addresses, handles, the domain pointer).
var verboseKeys = map[string]string{
	"fi_tx_attr": "tx_attr", "fi_rx_attr": "rx_attr", "fi_ep_attr": "ep_attr",
	"fi_domain_attr": "domain_attr", "fi_fabric_attr": "fabric_attr",
	"fi_device_attr": "device_attr", "fi_bus_attr": "bus_attr", "fi_pci_attr": "pci",
	"fi_link_attr": "link_attr",
}

var skippedKeys = map[string]bool{
	"src_addrlen": true, "dest_addrlen": true, "src_addr": true, "dest_addr": true,
	"handle": true, "domain": true,
}

// stringKeys are Info fields that are strings even when fi_info prints a
// number ("device_id: 0xefa1", "device_version: 6").
var stringKeys = map[string]bool{
	"name": true, "prov_name": true, "prov_version": true, "api_version": true,
	"device_id": true, "device_version": true, "vendor_id": true, "driver": true,
	"firmware": true, "address": true, "network_type": true,
}

// infoFromNode turns one fi_info document into JSON with Info's field
// names and decodes it, so the flag and enum names go through the same
// tables as `fitransfer info --json`.
func infoFromNode(doc *node) (Info, error) {
	obj, err := objectOf(doc)
	if err != nil {
		return Info{}, err
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return Info{}, err
	}
	var in Info
	if err := json.Unmarshal(b, &in); err != nil {
		return Info{}, fmt.Errorf("fi_info -v: %w", err)
	}
	return in, nil
}

func objectOf(n *node) (map[string]any, error) {
	obj := map[string]any{}
	for _, k := range n.kids {
		if skippedKeys[k.key] {
			continue
		}
		name := k.key
		if mapped, ok := verboseKeys[name]; ok {
			name = mapped
		}
		switch {
		case len(k.kids) > 0:
			sub, err := objectOf(k)
			if err != nil {
				return nil, err
			}
			obj[name] = sub
		case k.val == "(nil)" || k.val == "(null)":
			// No nic, or no value.
		case k.key == "progress":
			// libfabric 2.x prints only the data progress model as
			// "progress"; its control_progress field is deprecated and not
			// printed, so it stays unspecified here.
			obj["data_progress"] = k.val
		default:
			v, err := valueOf(k.key, k.val, n.key == "fi_pci_attr")
			if err != nil {
				return nil, err
			}
			obj[name] = v
		}
	}
	return obj, nil
}

// valueOf converts one printed value: a "[ A, B ]" flag list to names
// (FI_ORDER_NONE is the empty set, which 1.x prints by name), a number to
// a JSON number, anything else to a string. In fi_pci_attr, device_id is
// a number.
func valueOf(key, val string, inPCI bool) (any, error) {
	if strings.HasPrefix(val, "[") && strings.HasSuffix(val, "]") {
		names := []string{}
		for _, f := range strings.Split(strings.Trim(val, "[]"), ",") {
			if f = strings.TrimSpace(f); f != "" && f != "FI_ORDER_NONE" && !otherMajorOnly(key, f) {
				names = append(names, f)
			}
		}
		return names, nil
	}
	if stringKeys[key] && !inPCI {
		return val, nil
	}
	if strings.HasPrefix(val, "0x") {
		u, err := strconv.ParseUint(val[2:], 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", key, val, err)
		}
		return json.Number(strconv.FormatUint(u, 10)), nil
	}
	if _, err := strconv.ParseUint(val, 10, 64); err == nil {
		return json.Number(val), nil
	}
	return val, nil
}

// otherMajorNames are caps and mode names that exist in only one of
// libfabric 1.x and 2.x (2.0 removed three mode bits and gave caps bits
// 45, 46 and 48 new names). fitransfer names bits after the loaded
// library, so a recorded output of the other major version may carry
// names this build does not know; they are dropped (fitransfer uses none
// of them) rather than failing the parse.
var otherMajorNames = map[string]bool{
	"FI_BUFFERED_RECV": true, "FI_NOTIFY_FLAGS_ONLY": true, "FI_RESTRICTED_COMP": true,
	"FI_VARIABLE_MSG": true, "FI_TAGGED_DIRECTED_RECV": true, "FI_TAGGED_MULTI_RECV": true,
	"FI_EXACT_DIRECTED_RECV": true,
}

func otherMajorOnly(key, name string) bool {
	if !otherMajorNames[name] {
		return false
	}
	var err error
	switch key {
	case "caps":
		_, err = ParseCaps(name)
	case "mode":
		_, err = ParseMode(name)
	default:
		return false
	}
	return err != nil
}
