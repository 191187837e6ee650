package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
)

// hintOptions are hint's flags.
type hintOptions struct {
	prov   string
	list   bool
	asJSON bool
}

// hintFlags is hint's flag set and the options it fills.
func hintFlags() (*flag.FlagSet, *hintOptions) {
	fs := flag.NewFlagSet("fitransfer hint", flag.ContinueOnError)
	o := &hintOptions{}
	fs.StringVar(&o.prov, "p", "", "provider whose prov_errno the numbers are (efa); without it numbers are fi_errno values")
	fs.BoolVar(&o.list, "list", false, "print the whole table")
	fs.BoolVar(&o.asJSON, "json", false, "machine-readable output (JSON)")
	fs.Usage = defaultUsage(fs, "[-p efa] CODE... | --list\n  CODE: a number, or an fi_errno name such as FI_EHOSTUNREACH")
	return fs, o
}

// runHint explains error numbers from fitransfer's hint table
// (fabric.HintTable, docs/EFA.md "Error hints"): the prov_errno a
// provider printed, or an fi_errno by number or name.
func runHint(args []string, stdout, stderr io.Writer) int {
	fs, o := hintFlags()
	codes, code, ok := parseArgs(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if o.prov == "tcp" {
		o.prov = "tcp;ofi_rxm"
	}
	var rows []fabric.HintRow
	switch {
	case o.list:
		rows = fabric.HintTable()
	case len(codes) == 0:
		fmt.Fprintln(stderr, "fitransfer hint: name an error number or FI_E* name, or use --list (see `fitransfer hint -h`)")
		return exitUsage
	}
	for _, c := range codes {
		r, err := lookupCode(o.prov, c)
		if err != nil {
			fmt.Fprintf(stderr, "fitransfer hint: %v\n", err)
			return exitFail
		}
		rows = append(rows, r)
	}
	if o.asJSON {
		if err := writeJSON(stdout, hintsJSON(rows)); err != nil {
			fmt.Fprintf(stderr, "fitransfer hint: %v\n", err)
			return exitFail
		}
		return exitOK
	}
	for i, r := range rows {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		what := fmt.Sprintf("fi_errno %d", int(r.Errno))
		if r.Provider != "" {
			what = fmt.Sprintf("%s prov_errno %d", r.Provider, r.ProvErrno)
		}
		fmt.Fprintf(stdout, "%s: %s\n  meaning: %s\n  fix:     %s\n", what, r.Name, r.Meaning, r.Fix)
	}
	return exitOK
}

// lookupCode finds the row of one code: a provider number with -p, else
// an fi_errno number or name.
func lookupCode(prov, c string) (fabric.HintRow, error) {
	n, err := strconv.Atoi(c)
	if err != nil {
		name := strings.ToUpper(c)
		for _, r := range fabric.HintTable() {
			if r.Provider == "" && r.Name == name {
				return r, nil
			}
		}
		return fabric.HintRow{}, fmt.Errorf("no hint for %q: give a number or an fi_errno name (`fitransfer hint --list` shows the table)", c)
	}
	if n < 0 {
		n = -n // libfabric returns -FI_E*
	}
	if prov != "" {
		if prov != "efa" {
			return fabric.HintRow{}, fmt.Errorf("no prov_errno table for provider %q: the table has efa's; without -p, %d is read as an fi_errno", prov, n)
		}
		if r, ok := fabric.LookupHint(prov, 0, n); ok && r.Provider == prov {
			return r, nil
		}
		return fabric.HintRow{}, fmt.Errorf("no hint for efa prov_errno %d (`fitransfer hint --list` shows the table)", n)
	}
	if r, ok := fabric.LookupHint("", fabric.Errno(n), 0); ok {
		return r, nil
	}
	return fabric.HintRow{}, fmt.Errorf("no hint for fi_errno %d (%v); for a provider's own number add -p efa", n, fabric.Errno(n))
}

type hintJSON struct {
	Provider  string `json:"provider,omitempty"`
	ProvErrno int    `json:"prov_errno,omitempty"`
	Errno     int    `json:"fi_errno,omitempty"`
	Name      string `json:"name"`
	Meaning   string `json:"meaning"`
	Fix       string `json:"fix"`
}

func hintsJSON(rows []fabric.HintRow) []hintJSON {
	out := make([]hintJSON, 0, len(rows))
	for _, r := range rows {
		out = append(out, hintJSON{Provider: r.Provider, ProvErrno: r.ProvErrno, Errno: int(r.Errno),
			Name: r.Name, Meaning: r.Meaning, Fix: r.Fix})
	}
	return out
}
