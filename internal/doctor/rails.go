package doctor

import (
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/topology"
	"github.com/fitransfer/fitransfer/transport"
)

// Rails are the rails a transport.Manager opens here for its remote
// provider (one endpoint per domain, or NIC), where each NIC sits, and
// which rails the memory of each accelerator and of each NUMA node is
// nearest (topology.Tree.Nearest).
type Rails struct {
	Provider string `json:"provider,omitempty"` // empty: no remote provider
	Rule     string `json:"rule"`               // why these rails
	Rails    []Rail `json:"rails"`
	// Note says what could not be shown: fi_info gave no PCI address
	// (tcp, shm), or sysfs could not be read.
	Note   string        `json:"note,omitempty"`
	Memory []MemoryRails `json:"memory,omitempty"`
	// Err is why a Manager would not open here (FITRANSFER_RAILS names a
	// domain the provider does not have); Rails is then empty.
	Err string `json:"error,omitempty"`
}

// Rail is one rail: its number in the Manager, its domain and, when
// fi_info gives the domain's PCI address, its NIC.
type Rail struct {
	Rail   int           `json:"rail"`
	Domain string        `json:"domain"`
	NIC    *topology.NIC `json:"nic,omitempty"`
}

// MemoryRails are the rails nearest the memory of one accelerator
// (Device) or of one NUMA node (NUMANode), by rail number.
type MemoryRails struct {
	Device   *topology.PCIAddr `json:"device,omitempty"`
	NUMANode *int              `json:"numa_node,omitempty"`
	Rails    []int             `json:"rails"`
}

func (m MemoryRails) location() topology.Location {
	if m.Device != nil {
		return topology.DeviceMemory(*m.Device)
	}
	return topology.HostMemory(*m.NUMANode)
}

// RailsHere asks fi_getinfo as a Manager does and returns the rails a
// default Manager would open with policy (`fitransfer info --rails`).
func RailsHere(policy fabric.RMAPolicy, sysfsRoot string) (*Rails, error) {
	infos, err := fabric.GetInfo(fabric.Query{Hints: fabric.RMAHints("")})
	if err != nil && !errors.Is(err, fabric.ErrNoData) {
		return nil, err
	}
	return railsFor(infos, policy, fabric.ProbeDeviceRMA(infos), sysfsRoot), nil
}

// railsFor picks the provider a Manager stripes over — as transport.New
// does: the first of the same-node and remote choices that is not shm —
// and shows its rails.
func railsFor(infos []fabric.Info, policy fabric.RMAPolicy, facts fabric.Facts, sysfsRoot string) *Rails {
	for _, loc := range []fabric.Locality{fabric.SameNode, fabric.Remote} {
		c, err := fabric.Select(infos, loc, policy, facts)
		if err == nil && c.Info != nil && c.Backend != fabric.BackendSHM {
			return railsOf(infos, c.Info, string(c.Backend), sysfsRoot)
		}
	}
	return &Rails{Rule: "no remote provider here: no rails"}
}

// railsOf shows the rails of first's provider (named provider) with the
// NICs of sysfsRoot.
func railsOf(infos []fabric.Info, first *fabric.Info, provider, sysfsRoot string) *Rails {
	r := &Rails{Provider: provider}
	names := transport.EnvRails()
	rails, err := transport.RailInfos(infos, first, names, transport.RailsEnv)
	if err != nil {
		r.Rule, r.Err = "named by "+transport.RailsEnv, err.Error()
		return r
	}
	switch {
	case len(names) == 1 && strings.TrimSpace(names[0]) == "all":
		r.Rule = "every domain (" + transport.RailsEnv + "=all)"
	case names != nil:
		r.Rule = "named by " + transport.RailsEnv
	case first.Fabric.ProvName == string(fabric.BackendEFA): // efa and efa-direct
		r.Rule = "every domain: the default for efa"
	default:
		r.Rule = "one domain: " + provider + " opens more only where " + transport.RailsEnv + " or WithRails names them"
	}
	var addrs []topology.PCIAddr
	var withPCI []int // rail of each of addrs
	for i, in := range rails {
		r.Rails = append(r.Rails, Rail{Rail: i, Domain: in.Domain.Name})
		if a, ok := topology.InfoAddr(in); ok {
			addrs = append(addrs, a)
			withPCI = append(withPCI, i)
		}
	}
	switch {
	case len(addrs) == 0:
		r.Note = "fi_info gives no PCI address for the domains of " + provider + ": no NIC to place, no memory → NIC mapping"
		return r
	case len(addrs) < len(rails):
		r.Note = "fi_info gives no PCI address for some rails: they are left out of the memory → NIC mapping"
	}
	tree := topology.Tree{Root: sysfsRoot}
	nics, err := tree.Describe(addrs)
	if err != nil {
		r.Note = joinNote(r.Note, "cannot read the PCI topology: "+err.Error())
		return r
	}
	nodes := map[int]bool{}
	for k, n := range nics {
		r.Rails[withPCI[k]].NIC = &nics[k]
		if n.NUMANode >= 0 {
			nodes[n.NUMANode] = true
		}
	}
	nearest := func(mem topology.Location) []int {
		var out []int
		for _, k := range tree.Nearest(addrs, mem) {
			out = append(out, withPCI[k])
		}
		return out
	}
	accels, err := tree.Accelerators()
	if err != nil {
		r.Note = joinNote(r.Note, "cannot list the accelerators: "+err.Error())
	}
	for _, a := range accels {
		r.Memory = append(r.Memory, MemoryRails{Device: &a, Rails: nearest(topology.DeviceMemory(a))})
	}
	var ns []int
	for n := range nodes {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	for _, n := range ns {
		r.Memory = append(r.Memory, MemoryRails{NUMANode: &n, Rails: nearest(topology.HostMemory(n))})
	}
	return r
}

func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// check is the rails line of the report: fail when no Manager would open.
func (r *Rails) check() Check {
	c := Check{Name: "rails", Status: Pass}
	switch {
	case r.Err != "":
		c.Status, c.Detail = Fail, r.Err
		c.Fix = "name domains of " + r.Provider + " in " + transport.RailsEnv + " (`fitransfer info -p " + r.Provider + "` lists them), or unset it"
	case r.Provider == "":
		c.Detail = r.Rule
	default:
		c.Detail = fmt.Sprintf("%d of %s (%s)", len(r.Rails), r.Provider, r.Rule)
	}
	return c
}

// WriteText prints the rails and the memory → NIC mapping as
// `fitransfer doctor` and `fitransfer info --rails` show them.
func (r *Rails) WriteText(w io.Writer) error {
	var b strings.Builder
	switch {
	case r.Provider == "":
		fmt.Fprintf(&b, "rails: %s\n", r.Rule)
	case r.Err != "":
		fmt.Fprintf(&b, "rails: none, a Manager does not open: %s\n", r.Err)
	default:
		fmt.Fprintf(&b, "rails: %d of %s (%s)\n", len(r.Rails), r.Provider, r.Rule)
	}
	width := 0
	for _, rl := range r.Rails {
		width = max(width, len(rl.Domain))
	}
	for _, rl := range r.Rails {
		nic := "no PCI address from fi_info"
		if rl.NIC != nil {
			nic = rl.NIC.String()
		}
		fmt.Fprintf(&b, "  rail %-2d %-*s  %s\n", rl.Rail, width, rl.Domain, nic)
	}
	if r.Note != "" {
		fmt.Fprintf(&b, "  %s\n", r.Note)
	}
	if len(r.Memory) > 0 {
		b.WriteString("memory → NIC: the rails nearest the memory of each accelerator and NUMA node\n")
		width = 0
		for _, m := range r.Memory {
			width = max(width, len(m.location().String()))
		}
		for _, m := range r.Memory {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, m.location().String(), r.railList(m.Rails))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// railList is "rail 0 (rdmap16s27)" or "rails 0 1 (rdmap16s27 rdmap32s27)".
func (r *Rails) railList(rails []int) string {
	var nums, names []string
	for _, i := range rails {
		nums = append(nums, strconv.Itoa(i))
		if nic := r.Rails[i].NIC; nic != nil && nic.Name != "" {
			names = append(names, nic.Name)
		} else if nic != nil {
			names = append(names, nic.Addr.String())
		}
	}
	s := "rail "
	if len(rails) != 1 {
		s = "rails "
	}
	return s + strings.Join(nums, " ") + " (" + strings.Join(names, " ") + ")"
}
