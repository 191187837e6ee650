package fabric

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// WriteSummary prints infos the way `fi_info` does without -v or -l:
// provider, fabric, domain, version, type and protocol of each, with
// libfabric's own names for the type and protocol.
func WriteSummary(w io.Writer, infos []Info) error {
	bw := bufio.NewWriter(w)
	for i := range infos {
		in := &infos[i]
		fmt.Fprintf(bw, "provider: %s\n", in.Fabric.ProvName)
		fmt.Fprintf(bw, "    fabric: %s\n", nullString(in.Fabric.Name))
		fmt.Fprintf(bw, "    domain: %s\n", nullString(in.Domain.Name))
		fmt.Fprintf(bw, "    version: %d.%d\n", in.Fabric.ProvVersion.Major(), in.Fabric.ProvVersion.Minor())
		fmt.Fprintf(bw, "    type: %s\n", ofi.EPTypeText(in.EP.Type))
		fmt.Fprintf(bw, "    protocol: %s\n", ofi.ProtocolText(in.EP.Protocol))
	}
	return bw.Flush()
}

// WriteProviders prints provider names and versions the way `fi_info -l`
// does; pass the result of a Query with ProvidersOnly.
func WriteProviders(w io.Writer, infos []Info) error {
	bw := bufio.NewWriter(w)
	for i := range infos {
		v := infos[i].Fabric.ProvVersion
		fmt.Fprintf(bw, "%s:\n    version: %d.%d\n", infos[i].Fabric.ProvName, v.Major(), v.Minor())
	}
	return bw.Flush()
}

// WriteVerbose prints infos the way `fi_info -v` does: libfabric's fi_tostr
// rendering of each, after a "---" line.
func WriteVerbose(w io.Writer, infos []Info) error {
	bw := bufio.NewWriter(w)
	for i := range infos {
		bw.WriteString("---\n")
		bw.WriteString(infos[i].Verbose())
	}
	return bw.Flush()
}

// Provider is one line of `fi_info -l`.
type Provider struct {
	Name    string  `json:"name"`
	Version Version `json:"version"`
}

// Report is the JSON document of `fitransfer info --json`: the library
// versions and either the providers (-l) or the infos.
type Report struct {
	Libfabric Versions   `json:"libfabric"`
	Providers []Provider `json:"providers,omitempty"`
	Infos     []Info     `json:"infos,omitempty"`
}

// WriteJSON writes a Report, indented, ending with a newline.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ProvidersOf lists the provider entries of a ProvidersOnly query.
func ProvidersOf(infos []Info) []Provider {
	out := make([]Provider, len(infos))
	for i := range infos {
		out[i] = Provider{Name: infos[i].Fabric.ProvName, Version: infos[i].Fabric.ProvVersion}
	}
	return out
}

// nullString prints an empty C string the way glibc's printf prints NULL.
func nullString(s string) string {
	if s == "" {
		return "(null)"
	}
	return s
}
