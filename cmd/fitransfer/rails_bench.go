package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/internal/netlab"
	"github.com/fitransfer/fitransfer/perftest"
	"github.com/fitransfer/fitransfer/transport"
)

// defaultRailRate is each link's rate in `bench --rails`: four such links
// carry a fifth to a tenth of what tcp;ofi_rxm moves over one unlimited
// veth on the 2-core machine of docs/PERFORMANCE.md, so the links stay
// the limit.
const defaultRailRate = "400mbit"

// railRowTime is how long a 1-rail row's timed part takes at the link
// rate, when -I does not set the iterations.
const railRowTime = 3 * time.Second

// railTarget is issue 15's bar: N rails move at least this share of N
// times what one rail moves, at 1 MiB and larger.
const railTarget = 0.9

// railsPlan is what `bench --rails` measures.
type railsPlan struct {
	rails   int
	rate    string
	bps     float64 // rate in bytes per second
	ops     []string
	sizes   []uint64
	iters   int // 0: from railRowTime
	warmup  int // -1: a tenth of the iterations
	window  int
	repeat  int
	timeout time.Duration
}

// railsRow is one op and size: the 1-rail and N-rail figures (medians
// over the repeats) and their ratio.
type railsRow struct {
	op                    string
	size                  uint64
	iters, window         int
	one, many             float64 // MB/sec
	ratio, ratioMin, rMax float64 // many / (N × one), median and range of the repeats' pairs
	links                 []uint64
}

// runRailsBench is `bench --rails N`: a lab of N links, a server in
// namespace B on all of them, and clients in A over one and over all.
func runRailsBench(fs *flag.FlagSet, o *benchOptions, stdout, stderr io.Writer) int {
	plan, err := newRailsPlan(fs, o)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	if os.Geteuid() != 0 {
		return fail(stderr, "bench", fmt.Errorf("--rails needs root (uid 0, runs as uid %d): it builds network namespaces, veth links and tc qdiscs with ip netns", os.Geteuid()))
	}
	ctx, stop := interruptible()
	defer stop()
	lab, err := openRailsLab(plan, stderr)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	defer lab.close()
	rows, err := lab.measure(ctx, plan)
	printRails(stdout, rows, plan, lab.lab.RailList(plan.rails), o.asCSV)
	switch {
	case ctx.Err() != nil:
		return exitInterrupted
	case err != nil:
		return fail(stderr, "bench", err)
	}
	return exitOK
}

// newRailsPlan checks the flags for a rails comparison and fills in its
// defaults.
func newRailsPlan(fs *flag.FlagSet, o *benchOptions) (*railsPlan, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range []string{"providers", "compare", "fabtests", "idle"} {
		if set[name] {
			return nil, usageError{fmt.Errorf("--%s does not apply to --rails (tcp;ofi_rxm over the lab's links, no peer tool)", name)}
		}
	}
	if o.rails < 2 || o.rails > 16 {
		return nil, usageError{fmt.Errorf("--rails %d: want 2 to 16 links", o.rails)}
	}
	if o.repeat < 1 || o.window < 1 || o.iters < 0 || o.warmup < 0 {
		return nil, usageError{errors.New("--repeat and -W must be >= 1, -I and -w >= 0")}
	}
	bps, err := parseRate(o.railRate)
	if err != nil {
		return nil, usageError{fmt.Errorf("--rail-rate: %w", err)}
	}
	p := &railsPlan{rails: o.rails, rate: o.railRate, bps: bps, iters: o.iters, warmup: -1,
		window: o.window, repeat: o.repeat, timeout: o.timeout, ops: []string{"read", "write"}}
	if set["w"] {
		p.warmup = o.warmup
	}
	if set["ops"] {
		p.ops = strings.Split(o.ops, ",")
		for _, op := range p.ops {
			if op != "read" && op != "write" {
				return nil, usageError{fmt.Errorf("--ops: %q with --rails; read, write", op)}
			}
		}
	}
	spec := "1m,4m,16m"
	if set["S"] {
		spec = o.sizes
	}
	if p.sizes, err = perftest.ParseSizes(spec); err != nil {
		return nil, usageError{fmt.Errorf("-S: %w", err)}
	}
	return p, nil
}

// parseRate reads a tc rate in bits per second with tc's decimal
// prefixes ("400mbit") and returns it in bytes per second.
func parseRate(s string) (float64, error) {
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}} {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseFloat(num, 64)
			if err != nil || v <= 0 {
				break
			}
			return v * u.mult / 8, nil
		}
	}
	return 0, fmt.Errorf("%q: want a rate such as 400mbit (kbit, mbit or gbit)", s)
}

// itersFor is the iterations and warm-up of size: from -I and -w, or a
// 1-rail row of about railRowTime and a tenth of that to warm up.
func (p *railsPlan) itersFor(size uint64) (iters, warmup int) {
	iters = p.iters
	if iters == 0 {
		iters = max(2, int(math.Ceil(railRowTime.Seconds()*p.bps/float64(size))))
	}
	warmup = p.warmup
	if warmup < 0 {
		warmup = max(1, iters/10)
	}
	return iters, warmup
}

// railsLab is the lab of a rails comparison with its server running in B
// on every link.
type railsLab struct {
	lab        *netlab.Lab
	exe        string
	server     string // the server's bootstrap address
	stopServer func()
	stderr     io.Writer
}

// openRailsLab builds the lab and starts the server.
func openRailsLab(p *railsPlan, stderr io.Writer) (*railsLab, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	lab, err := netlab.New(p.rails, p.rate)
	if err != nil {
		return nil, err
	}
	l := &railsLab{lab: lab, exe: exe, stderr: stderr}
	size := slices.Max(p.sizes)
	// Room for the next client's buffer while the last one's goes.
	cmd := lab.Command(context.Background(), lab.B, exe, "serve", "--listen", lab.AddrB(0)+":0", "-p", "tcp",
		"--size", strconv.FormatUint(size, 10), "--max-memory", strconv.FormatUint(4*size, 10))
	cmd.Env = l.env(p.rails)
	cmd.Stderr = stderr
	if l.server, l.stopServer, err = startServeCmd(cmd, "rails"); err != nil {
		_ = lab.Close()
		return nil, err
	}
	return l, nil
}

// close stops the server and removes the lab.
func (l *railsLab) close() {
	l.stopServer()
	if err := l.lab.Close(); err != nil {
		fmt.Fprintf(l.stderr, "fitransfer bench: removing the rails lab: %s\n", oneLine(err))
	}
}

// env is the environment of a server or client over the first n links.
// FI_TCP_IFACE goes: it would pin tcp to one interface (bench's own
// sweep sets it to lo), and the rails are the interfaces.
func (l *railsLab) env(n int) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "FI_TCP_IFACE=") || strings.HasPrefix(kv, transport.RailsEnv+"=")
	})
	return append(env, transport.RailsEnv+"="+l.lab.RailList(n))
}

// measure runs every op and size, each repeat a 1-rail run followed at
// once by an N-rail run, so that drift in the machine's speed moves both
// figures of a pair. It returns the rows measured so far with an error.
func (l *railsLab) measure(ctx context.Context, p *railsPlan) ([]railsRow, error) {
	var rows []railsRow
	for _, op := range p.ops {
		for _, size := range p.sizes {
			iters, warmup := p.itersFor(size)
			row := railsRow{op: op, size: size, iters: iters, window: min(p.window, iters), links: make([]uint64, p.rails)}
			var ones, manys, ratios []float64
			for i := 0; i < p.repeat; i++ {
				one, _, err := l.client(ctx, p, 1, op, size, iters, warmup)
				if err != nil {
					return rows, err
				}
				many, links, err := l.client(ctx, p, p.rails, op, size, iters, warmup)
				if err != nil {
					return rows, err
				}
				ones, manys = append(ones, one), append(manys, many)
				ratios = append(ratios, many/(float64(p.rails)*one))
				for k, b := range links {
					row.links[k] += b
				}
			}
			row.one, row.many = median(ones), median(manys)
			row.ratio, row.ratioMin, row.rMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
			rows = append(rows, row)
		}
	}
	return rows, nil
}

// client runs `fitransfer op` in A over the first n links for one size
// and returns its MB/sec and the bytes each link carried meanwhile.
func (l *railsLab) client(ctx context.Context, p *railsPlan, n int, op string, size uint64, iters, warmup int) (float64, []uint64, error) {
	// The run's own --timeout bounds each window; this bounds a client
	// that hangs elsewhere.
	expected := time.Duration(float64(uint64(iters+warmup)*size) / p.bps * float64(time.Second))
	ctx, cancel := context.WithTimeout(ctx, p.timeout+2*expected)
	defer cancel()
	cmd := l.lab.Command(ctx, l.lab.A, l.exe, op, l.server, "-p", "tcp", "-S", strconv.FormatUint(size, 10),
		"-I", strconv.Itoa(iters), "-w", strconv.Itoa(warmup), "-W", strconv.Itoa(p.window),
		"--timeout", p.timeout.String(), "--json")
	cmd.Env = l.env(n)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	before, err := l.linkBytes(p.rails)
	if err != nil {
		return 0, nil, err
	}
	if err := cmd.Run(); err != nil {
		return 0, nil, fmt.Errorf("%s %s over %d rail(s): %v: %s", op, perftest.SizeString(size), n, err, lastLine(errOut.String()))
	}
	after, err := l.linkBytes(p.rails)
	if err != nil {
		return 0, nil, err
	}
	var rows []perftest.Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil || len(rows) != 1 || !rows[0].Complete {
		return 0, nil, fmt.Errorf("%s %s over %d rail(s) printed %q", op, perftest.SizeString(size), n, out.String())
	}
	for k := range after {
		after[k] -= before[k]
	}
	return rows[0].MBps, after, nil
}

// linkBytes is what each link has carried so far.
func (l *railsLab) linkBytes(n int) ([]uint64, error) {
	out := make([]uint64, n)
	for i := range out {
		var err error
		if out[i], err = l.lab.Bytes(i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// printRails prints the comparison as a table, or CSV with the caption
// behind "# "; all is the FITRANSFER_RAILS of the N-rail runs.
func printRails(w io.Writer, rows []railsRow, p *railsPlan, all string, asCSV bool) {
	n := p.rails
	prefix := ""
	if asCSV {
		prefix = "# "
	}
	fmt.Fprintf(w, "%s%d veth links at %s each way (tc tbf) between two network namespaces, tcp;ofi_rxm; 1 rail: %s=rail0, %d rails: %s=%s\n",
		prefix, n, p.rate, transport.RailsEnv, n, transport.RailsEnv, all)
	fmt.Fprintf(w, "%sratio = %d-rail / (%d × 1-rail) MB/sec; target >= %.1f from 1 MiB (smaller transfers are not striped); link MB: what each link carried in the %d-rail runs\n",
		prefix, n, n, railTarget, n)
	head := []string{"test", "bytes", "iters", "window", "1-rail MB/sec", fmt.Sprintf("%d-rail MB/sec", n), "ratio"}
	if p.repeat > 1 {
		head = append(head, "ratio range")
	}
	head = append(head, fmt.Sprintf(">= %.1f", railTarget), fmt.Sprintf("%d-rail link MB", n))
	line := func(r railsRow) []string {
		l := []string{r.op, perftest.SizeString(r.size), strconv.Itoa(r.iters), strconv.Itoa(r.window), f2(r.one), f2(r.many), f2(r.ratio)}
		if p.repeat > 1 {
			l = append(l, f2(r.ratioMin)+"-"+f2(r.rMax))
		}
		met := "-"
		if r.size >= 1<<20 { // transport stripes from 1 MiB (stripeMin)
			met = map[bool]string{true: "yes", false: "no"}[r.ratio >= railTarget]
		}
		var mb []string
		for _, b := range r.links {
			mb = append(mb, strconv.FormatUint((b+500_000)/1_000_000, 10))
		}
		return append(l, met, strings.Join(mb, "/"))
	}
	var lines [][]string
	for _, r := range rows {
		lines = append(lines, line(r))
	}
	writeTable(w, head, lines, asCSV)
}
