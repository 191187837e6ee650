// Package netlab builds two hosts joined by several links on one machine:
// two network namespaces and N veth pairs between them, each pair its own
// subnet, so that tcp;ofi_rxm lists one domain per link — the rails of a
// multi-NIC node, for tests and `fitransfer bench --rails`. It needs root
// (ip netns) and iproute2.
package netlab

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
)

// Lab is two namespaces, A and B, joined by rails: in both, interface
// Iface(i) is one end of pair i; A has AddrA(i), B AddrB(i).
type Lab struct {
	A, B  string
	Rails int
	tag   string
}

var labs atomic.Int32

// New builds a lab of rails links. rate, when not "", limits each link in
// each direction with a tc token bucket ("400mbit"), so that the links,
// not the CPU, bound a transfer. Close removes it.
func New(rails int, rate string) (*Lab, error) {
	if rails < 1 || rails > 16 {
		return nil, fmt.Errorf("netlab: %d rails; 1 to 16", rails)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("netlab: ip (iproute2) not found: run `make deps`")
	}
	tag := fmt.Sprintf("%d%c", os.Getpid()%100000, 'a'+rune(labs.Add(1)%26))
	l := &Lab{A: "ftla" + tag, B: "ftlb" + tag, Rails: rails, tag: tag}
	if err := l.build(rate); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

func (l *Lab) build(rate string) error {
	steps := [][]string{{"netns", "add", l.A}, {"netns", "add", l.B}}
	for _, ns := range []string{l.A, l.B} {
		steps = append(steps, []string{"-n", ns, "link", "set", "lo", "up"})
	}
	for i := 0; i < l.Rails; i++ {
		a, b := fmt.Sprintf("fl%sa%d", l.tag, i), fmt.Sprintf("fl%sb%d", l.tag, i)
		steps = append(steps,
			[]string{"link", "add", a, "type", "veth", "peer", "name", b},
			[]string{"link", "set", a, "netns", l.A},
			[]string{"link", "set", b, "netns", l.B},
			[]string{"-n", l.A, "link", "set", a, "name", l.Iface(i)},
			[]string{"-n", l.B, "link", "set", b, "name", l.Iface(i)},
			[]string{"-n", l.A, "addr", "add", l.AddrA(i) + "/24", "dev", l.Iface(i)},
			[]string{"-n", l.B, "addr", "add", l.AddrB(i) + "/24", "dev", l.Iface(i)},
			[]string{"-n", l.A, "link", "set", l.Iface(i), "up"},
			[]string{"-n", l.B, "link", "set", l.Iface(i), "up"})
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return err
		}
	}
	for _, ns := range []string{l.A, l.B} {
		// IPv4 only: tcp would list each link twice, once per family.
		if err := run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"); err != nil {
			return err
		}
		if rate == "" {
			continue
		}
		if _, err := exec.LookPath("tc"); err != nil {
			return fmt.Errorf("netlab: tc (iproute2) not found: run `make deps`")
		}
		for i := 0; i < l.Rails; i++ {
			if err := run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", l.Iface(i), "root", "tbf",
				"rate", rate, "burst", "512kb", "latency", "100ms"); err != nil {
				return err
			}
		}
	}
	return nil
}

// Close removes the namespaces, and with them the links.
func (l *Lab) Close() error {
	errA := run("ip", "netns", "del", l.A)
	errB := run("ip", "netns", "del", l.B)
	if errA != nil {
		return errA
	}
	return errB
}

// Iface is rail i's interface, in A and in B.
func (l *Lab) Iface(i int) string { return fmt.Sprintf("rail%d", i) }

// AddrA is A's address on rail i.
func (l *Lab) AddrA(i int) string { return fmt.Sprintf("10.81.%d.1", i) }

// AddrB is B's address on rail i.
func (l *Lab) AddrB(i int) string { return fmt.Sprintf("10.81.%d.2", i) }

// RailList is the first n rails' interfaces, comma-separated: the value of
// FITRANSFER_RAILS that makes a manager stripe over them.
func (l *Lab) RailList(n int) string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, l.Iface(i))
	}
	return strings.Join(out, ",")
}

// Cut takes rail i down on A's side: what crosses it stops, without an
// error to either end's sockets.
func (l *Lab) Cut(i int) error { return run("ip", "-n", l.A, "link", "set", l.Iface(i), "down") }

// Restore brings rail i back up.
func (l *Lab) Restore(i int) error { return run("ip", "-n", l.A, "link", "set", l.Iface(i), "up") }

// Command runs name with args in namespace ns.
func (l *Lab) Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Bytes is what rail i carried so far, received and sent, on A's side.
func (l *Lab) Bytes(i int) (uint64, error) { return LinkBytes(l.A, l.Iface(i)) }

// LinkBytes is what interface dev of namespace ns carried so far,
// received and sent.
func LinkBytes(ns, dev string) (uint64, error) {
	out, err := exec.Command("ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev).Output()
	if err != nil {
		return 0, fmt.Errorf("netlab: ip -n %s -s link show dev %s: %w", ns, dev, err)
	}
	var links []struct {
		Stats struct {
			RX struct{ Bytes uint64 } `json:"rx"`
			TX struct{ Bytes uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return 0, fmt.Errorf("netlab: reading the counters of %s: %v", dev, err)
	}
	return links[0].Stats.RX.Bytes + links[0].Stats.TX.Bytes, nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netlab: %s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
