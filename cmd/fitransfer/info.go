package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/doctor"
)

// knownProviders are provider names libfabric 1.17–2.x can be built with,
// so that `-p efa` on a machine without EFA is told apart from a typo.
var knownProviders = []string{
	"bgq", "cxi", "efa", "gni", "lnx", "lpp", "mlx", "mrail", "net", "netdir", "ofi_mrail",
	"ofi_rxd", "ofi_rxm", "opx", "psm", "psm2", "psm3", "rstream", "rxd", "rxm", "shm", "sm2",
	"sockets", "tcp", "ucx", "udp", "usnic", "verbs",
}

// infoOptions are info's flags: fi_info's, and --version, --json.
type infoOptions struct {
	node, port, src, caps, mode, epType, domain, fabricName, addrFormat, prov, getenv string
	list, verbose, version, asJSON, env, rails                                        bool
}

// infoFlags is info's flag set and the options it fills.
func infoFlags() (*flag.FlagSet, *infoOptions) {
	fs := flag.NewFlagSet("fitransfer info", flag.ContinueOnError)
	o := &infoOptions{}
	str := func(p *string, short, long, help string) {
		fs.StringVar(p, short, "", help)
		fs.StringVar(p, long, "", help)
	}
	boolean := func(p *bool, short, long, help string) {
		fs.BoolVar(p, short, false, help)
		fs.BoolVar(p, long, false, help)
	}
	str(&o.src, "s", "src_addr", "source name or address (sets FI_SOURCE)")
	str(&o.node, "n", "node", "dest node name or address")
	str(&o.port, "P", "port", "port number")
	str(&o.caps, "c", "caps", "one or more capabilities: FI_MSG|FI_RMA...")
	str(&o.mode, "m", "mode", "one or more modes, default all modes")
	str(&o.epType, "t", "ep_type", "endpoint type: FI_EP_MSG, FI_EP_DGRAM, FI_EP_RDM...")
	str(&o.domain, "d", "domain", "domain name")
	str(&o.fabricName, "f", "fabric", "fabric name")
	str(&o.addrFormat, "a", "addr_format", "address format: FI_FORMAT_UNSPEC, FI_SOCKADDR...")
	str(&o.prov, "p", "provider", "provider, e.g. shm, tcp, \"tcp;ofi_rxm\", efa")
	boolean(&o.env, "e", "env", "print libfabric environment variables")
	str(&o.getenv, "g", "getenv", "print libfabric environment variables with substr")
	boolean(&o.list, "l", "list", "list available libfabric providers")
	boolean(&o.verbose, "v", "verbose", "verbose output (fi_tostr of every fi_info)")
	fs.BoolVar(&o.version, "version", false, "print version info and exit")
	fs.BoolVar(&o.asJSON, "json", false, "print everything as JSON (docs/info-json.md)")
	fs.BoolVar(&o.rails, "rails", false, "print the rails a Manager opens here and which memory is nearest which NIC, as doctor does (with --json: as JSON); takes no fi_info flag")
	fs.Usage = defaultUsage(fs, "[flags]  (the flags of fi_info, same meaning)")
	return fs, o
}

func runInfo(args []string, stdout, stderr io.Writer) int {
	fs, o := infoFlags()
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	// -g "" lists every variable, as fi_info's does: what counts is that
	// it was given.
	var filter bool
	fs.Visit(func(f *flag.Flag) { filter = filter || f.Name == "g" || f.Name == "getenv" })
	o.env = o.env || filter
	if o.env && o.asJSON {
		fmt.Fprintln(stderr, "fitransfer info: --json does not include libfabric's variables; use -e or -g without --json")
		return exitUsage
	}
	if o.rails {
		return infoRails(fs, o.asJSON, stdout, stderr)
	}
	vers := fabric.CurrentVersions()
	if o.version {
		fmt.Fprintf(stdout, "fitransfer: %s\nlibfabric: %s\nlibfabric api: %s\n", buildVersion(), vers.Library, vers.Compiled)
		fmt.Fprintf(stdout, "negotiated api: %s (older of compiled %s and runtime %s)\n", vers.API, vers.Compiled, vers.Runtime)
		fmt.Fprintf(stdout, "compiled in: %s\n", fabric.CompiledFeatures())
		return exitOK
	}

	// Hints exactly as fi_info builds them, so the answers are the same.
	var hints *fabric.Info
	h := &fabric.Info{Mode: ^fabric.Mode(0)}
	h.Domain.Mode = ^fabric.Mode(0)
	h.Domain.MRMode = ^fabric.MRMode(0) &^ (1 | 2) // all but FI_MR_BASIC | FI_MR_SCALABLE
	bad := func(err error) int {
		fmt.Fprintf(stderr, "fitransfer info: %v\n", err)
		return exitUsage
	}
	if o.caps != "" {
		c, err := fabric.ParseCaps(o.caps)
		if err != nil {
			return bad(err)
		}
		h.Caps, hints = c, h
	}
	if o.mode != "" {
		m, err := fabric.ParseMode(o.mode)
		if err != nil {
			return bad(err)
		}
		h.Mode, hints = m, h
	}
	if o.epType != "" {
		t, err := fabric.ParseEPType(o.epType)
		if err != nil {
			return bad(err)
		}
		h.EP.Type, hints = t, h
	}
	if o.addrFormat != "" {
		a, err := fabric.ParseAddrFormat(o.addrFormat)
		if err != nil {
			return bad(err)
		}
		h.AddrFormat, hints = a, h
	}
	if o.prov != "" {
		if err := checkProviderName(o.prov); err != nil {
			return bad(err)
		}
		h.Fabric.ProvName, hints = o.prov, h
	}
	if o.domain != "" {
		h.Domain.Name, hints = o.domain, h
	}
	if o.fabricName != "" {
		h.Fabric.Name, hints = o.fabricName, h
	}
	q := fabric.Query{Hints: hints, Node: o.node, Service: o.port, ProvidersOnly: o.list}
	if o.src != "" {
		q.Node, q.Source = o.src, true
	}
	infos, err := fabric.GetInfo(q)
	if err != nil {
		fmt.Fprintf(stderr, "fitransfer info: %v%s\n", err, noDataHint(err, o.prov))
		return exitFail
	}
	switch {
	case o.env:
		// fi_info prints the variables only after its query succeeded, so
		// -e with filters no provider matches fails as the query does.
		var params []fabric.Param
		if params, err = fabric.Params(); err == nil {
			err = writeParams(stdout, params, filter, o.getenv)
		}
	case o.asJSON:
		r := fabric.Report{Libfabric: vers}
		if o.list {
			r.Providers = fabric.ProvidersOf(infos)
		} else {
			r.Infos = infos
		}
		err = fabric.WriteJSON(stdout, r)
	case o.verbose:
		err = fabric.WriteVerbose(stdout, infos)
	case o.list:
		err = fabric.WriteProviders(stdout, infos)
	default:
		err = fabric.WriteSummary(stdout, infos)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fitransfer info: %v\n", err)
		return exitFail
	}
	return exitOK
}

// infoRails is `info --rails`: the rails and memory → NIC mapping of
// `fitransfer doctor`, without the checks. fi_info's flags filter what
// fi_getinfo answers, which would not be the rails a Manager opens, so
// they are refused here.
func infoRails(fs *flag.FlagSet, asJSON bool, stdout, stderr io.Writer) int {
	var other []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "rails" && f.Name != "json" {
			other = append(other, "-"+f.Name)
		}
	})
	if len(other) > 0 {
		fmt.Fprintf(stderr, "fitransfer info: --rails takes no other flag than --json (got %s)\n", strings.Join(other, " "))
		return exitUsage
	}
	r, err := doctor.RailsHere(fabric.RequireDeviceRMA, fabric.SysfsRoot)
	if err == nil && asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(r)
	} else if err == nil {
		err = r.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "fitransfer info: %v\n", err)
		return exitFail
	}
	if r.Err != "" {
		return exitFail
	}
	return exitOK
}

// checkProviderName accepts what fi_getinfo accepts in prov_name: names
// joined by ';' (layering) or ',' (a list), each optionally prefixed by
// '^' (exclusion). Every name must be one libfabric knows.
func checkProviderName(p string) error {
	avail := availableProviders()
	for _, part := range strings.FieldsFunc(p, func(r rune) bool { return r == ';' || r == ',' }) {
		name := strings.TrimPrefix(strings.TrimSpace(part), "^")
		if name == "" || contains(avail, name) || contains(knownProviders, name) || strings.HasPrefix(name, "ofi_hook_") {
			continue
		}
		return fmt.Errorf("unknown provider %q; available here: %s (libfabric also knows: %s)",
			name, strings.Join(avail, ", "), strings.Join(knownProviders, ", "))
	}
	return nil
}

// availableProviders is `fi_info -l`: the providers that loaded here.
func availableProviders() []string {
	infos, err := fabric.GetInfo(fabric.Query{ProvidersOnly: true})
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range fabric.ProvidersOf(infos) {
		if !contains(out, p.Name) {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// noDataHint explains -FI_ENODATA for a provider that exists but did not
// answer.
func noDataHint(err error, prov string) string {
	if !errors.Is(err, fabric.ErrNoData) {
		return ""
	}
	if prov == "efa" {
		// 1.x leaves efa out of -l without a device; 2.x lists it anyway.
		if devs, derr := fabric.EFADevices("/sys"); derr == nil && len(devs) == 0 {
			return "; the efa provider found no EFA device here (run `fitransfer doctor`)"
		}
	}
	if prov != "" && !contains(availableProviders(), strings.TrimPrefix(prov, "^")) {
		return fmt.Sprintf("; provider %q did not load on this machine (see `fitransfer info -l`)", prov)
	}
	return "; no provider matches these filters"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
