package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/floor"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/perftest"
	"github.com/fitransfer/fitransfer/transport"
)

// benchRow is one line of the bench table: our figures and, with
// --compare, the peer tool's for the same provider, op, size, window and
// iterations. With --repeat N every figure is the median of N runs, and
// the ranges say how far the runs spread.
type benchRow struct {
	perftest.Row
	Repeats     int     `json:"repeats"`
	MBpsMin     float64 `json:"mb_per_sec_min"`
	MBpsMax     float64 `json:"mb_per_sec_max"`
	Peer        string  `json:"peer,omitempty"`
	PeerMBps    float64 `json:"peer_mb_per_sec,omitempty"`
	PeerUsec    float64 `json:"peer_usec_per_xfer,omitempty"`
	PeerMBpsMin float64 `json:"peer_mb_per_sec_min,omitempty"`
	PeerMBpsMax float64 `json:"peer_mb_per_sec_max,omitempty"`
	// Ratio is ours / peer (MB/sec): the median of the per-repeat
	// ratios, each of a run of ours and a run of the peer tool made one
	// right after the other, so that a machine whose speed drifts (a
	// busy neighbour, a CPU shared with another guest) moves both.
	Ratio     float64 `json:"ratio,omitempty"`
	RatioMin  float64 `json:"ratio_min,omitempty"`
	RatioMax  float64 `json:"ratio_max,omitempty"`
	PeerError string  `json:"peer_error,omitempty"`
}

// benchOptions are bench's flags.
type benchOptions struct {
	providers string
	sizes     string
	iters     int
	warmup    int
	window    int
	ops       string
	asCSV     bool
	compare   bool
	fabtests  string
	timeout   time.Duration
	repeat    int
	idle      time.Duration
	rails     int
	railRate  string
}

// benchFlags is bench's flag set and the options it fills.
func benchFlags() (*flag.FlagSet, *benchOptions) {
	fs := flag.NewFlagSet("fitransfer bench", flag.ContinueOnError)
	o := &benchOptions{}
	fs.StringVar(&o.providers, "providers", "", "providers to sweep, comma-separated (default: every usable one of mem, cma, shm, tcp;ofi_rxm, efa)")
	fs.StringVar(&o.sizes, "S", "8,4k,64k,1m", "sizes (as read/write -S, or a comma-separated list)")
	fs.IntVar(&o.iters, "I", 0, "iterations per size (default: fabtests' per size)")
	fs.IntVar(&o.warmup, "w", 10, warmupUsage)
	fs.IntVar(&o.window, "W", 64, "window for read and write")
	fs.StringVar(&o.ops, "ops", "read,write,pingpong", "tests to run")
	fs.BoolVar(&o.asCSV, "csv", false, "print CSV")
	fs.BoolVar(&o.compare, "compare", false, "run the peer tools too, side by side: fi_pingpong (libfabric-bin), fi_rma_bw / fi_rdm_pingpong / fi_rma_pingpong (fabtests 1.21 on) from $FABTESTS_BIN, and for 8 B pingpongs and window-1 reads and writes over shm and tcp the floor under them (raw endpoints, no engine)")
	fs.StringVar(&o.fabtests, "fabtests", os.Getenv("FABTESTS_BIN"), "directory holding fabtests' fi_rma_bw and fi_rdm_pingpong")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "deadline of each transfer and of each peer tool run")
	fs.DurationVar(&o.idle, "idle", 10*time.Second, "after the table, measure over this idle span the CPU of a manager with default options, and per route the first 8 B read after each fifth of it (lines after the table; behind \"# \" with --csv); 0 skips it")
	fs.IntVar(&o.repeat, "repeat", 1, "run every measurement this many times and keep the median (MB/sec), for ours and the peer tools alike; with --compare each of our runs is followed by the peer tool's")
	fs.IntVar(&o.rails, "rails", 0, "instead of the sweep, build two network namespaces joined by this many veth links (root), and print tcp;ofi_rxm read and write bandwidth over 1 link and over all of them side by side (default sizes 1m,4m,16m)")
	fs.StringVar(&o.railRate, "rail-rate", defaultRailRate, "with --rails: each link's rate in each direction (tc tbf; kbit, mbit or gbit), low enough that the links, not the CPU, are the limit")
	fs.Usage = defaultUsage(fs, "[flags]")
	return fs, o
}

func runBench(args []string, stdout, stderr io.Writer) int {
	fs, o := benchFlags()
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if o.rails != 0 {
		return runRailsBench(fs, o, stdout, stderr)
	}
	sz, err := perftest.ParseSizes(o.sizes)
	if err != nil {
		return fail(stderr, "bench", usageError{fmt.Errorf("-S: %w", err)})
	}
	// bench measures on loopback: its server listens on 127.0.0.1, and
	// serve writes (pingpong) only to its client's address. Left to
	// itself, libfabric's tcp picks the first interface up (eth0), and
	// the pingpong over tcp;ofi_rxm was refused. Set before libfabric
	// starts; the servers inherit it.
	if _, set := os.LookupEnv("FI_TCP_IFACE"); !set {
		_ = os.Setenv("FI_TCP_IFACE", "lo")
	}
	provs, err := benchProviders(o.providers)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	ctx, stop := interruptible()
	defer stop()
	var rows []benchRow
	if o.repeat < 1 {
		return fail(stderr, "bench", usageError{errors.New("--repeat must be >= 1")})
	}
	if o.timeout <= 0 {
		return fail(stderr, "bench", usageError{fmt.Errorf("--timeout %v: want a positive duration", o.timeout)})
	}
	var peers *peerTools
	if o.compare {
		exe, err := os.Executable()
		if err != nil {
			return fail(stderr, "bench", err)
		}
		peers = &peerTools{fabtestsDir: o.fabtests, warmup: o.warmup, window: o.window, timeout: o.timeout, exe: exe}
	}
	for _, prov := range provs {
		r, err := benchProvider(ctx, prov, strings.Split(o.ops, ","), sz, o.iters, o.warmup, o.window, o.repeat, o.timeout, peers, stderr)
		rows = append(rows, r...)
		if err != nil {
			printBench(stdout, rows, o.asCSV, o.compare, o.repeat)
			if ctx.Err() != nil {
				return exitInterrupted
			}
			return fail(stderr, "bench", fmt.Errorf("%s: %w", prov, err))
		}
	}
	// The bound the mem route is held against: a plain copy of the same
	// sizes, in the same run.
	if slices.Contains(provs, "mem") && (strings.Contains(o.ops, "read") || strings.Contains(o.ops, "write")) {
		var copies [][]perftest.Row
		for i := 0; i < o.repeat; i++ {
			r, err := perftest.RunMemcpy(sz, o.iters, o.warmup, o.window)
			if err != nil {
				return fail(stderr, "bench", fmt.Errorf("memcpy: %w", err))
			}
			copies = append(copies, r)
		}
		rows = append(rows, aggregate(copies, nil)...)
	}
	printBench(stdout, rows, o.asCSV, o.compare, o.repeat)
	if o.idle > 0 {
		prefix := ""
		if o.asCSV {
			prefix = "# "
		}
		err := measureIdle(ctx, provs, o.idle, o.timeout, stderr).print(stdout, prefix)
		if ctx.Err() != nil {
			return exitInterrupted
		}
		if err != nil {
			return fail(stderr, "bench", fmt.Errorf("idle figures: %w", err))
		}
	}
	return exitOK
}

// benchProviders is the sweep: the requested providers, or every usable
// one.
func benchProviders(spec string) ([]string, error) {
	if spec != "" {
		var out []string
		for _, p := range strings.Split(spec, ",") {
			if p == "tcp" {
				p = string(fabric.BackendTCP)
			}
			out = append(out, p)
		}
		return out, nil
	}
	infos, err := fabric.GetInfo(fabric.Query{Hints: fabric.RMAHints("")})
	if err != nil {
		return nil, err
	}
	var out []string
	if ok, _ := transport.MemAvailable(); ok {
		out = append(out, "mem")
	}
	if ok, _ := transport.CMAAvailable(); ok {
		out = append(out, "cma")
	}
	for _, want := range []string{"shm", string(fabric.BackendTCP), "efa"} {
		for _, in := range infos {
			if in.Fabric.ProvName == want && !contains(out, want) {
				out = append(out, want)
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no usable provider (see `fitransfer doctor`)")
	}
	return out, nil
}

// benchProvider runs the tests over prov, each repeat times. Each run
// starts a local server process and a client manager of its own and
// closes both before the peer tool (peers, when not nil) measures the
// same sizes: the client's busy progress loop must not spin while the
// peer tool runs. Ours and the peer tool's runs alternate, so that both
// see the machine in the same state.
func benchProvider(ctx context.Context, prov string, ops []string, sizes []uint64, iters, warmup, window, repeat int,
	timeout time.Duration, peers *peerTools, stderr io.Writer) ([]benchRow, error) {
	var rows []benchRow
	for _, op := range ops {
		mode := map[string]string{"read": bootstrap.ModeRead, "write": bootstrap.ModeWrite, "pingpong": bootstrap.ModePingPong}[op]
		if mode == "" {
			return rows, usageError{fmt.Errorf("--ops: unknown test %q (read, write, pingpong)", op)}
		}
		var ours [][]perftest.Row
		var theirs [][]peerResult
		var second [][]peerResult // a second peer tool, for some rows (peerTools.second)
		var floors [][]peerResult // the raw-endpoint floor, for some rows (peerTools.hasFloor)
		for i := 0; i < repeat; i++ {
			r, err := benchOnce(ctx, prov, mode, sizes, iters, warmup, window, timeout, stderr)
			if err != nil {
				if len(ours) > 0 { // the repeats that finished
					return append(rows, aggregate(ours, theirs)...), err
				}
				for _, row := range r { // what this run measured
					rows = append(rows, benchRow{Row: row, Repeats: 1, MBpsMin: row.MBps, MBpsMax: row.MBps})
				}
				return rows, err
			}
			ours = append(ours, r)
			if peers != nil {
				pr, pl, pf := make([]peerResult, len(r)), make([]peerResult, len(r)), make([]peerResult, len(r))
				for k := range r {
					pr[k] = peers.run(ctx, r[k], false)
					if peers.second(r[k]) {
						pl[k] = peers.run(ctx, r[k], true)
					}
					if peers.hasFloor(r[k]) {
						pf[k] = peers.runFloor(ctx, r[k])
					}
				}
				theirs, second, floors = append(theirs, pr), append(second, pl), append(floors, pf)
			}
		}
		rows = append(rows, aggregate(ours, theirs)...)
		if peers != nil {
			for _, extra := range [][][]peerResult{second, floors} {
				for _, row := range aggregate(ours, extra) {
					if row.Peer != "" {
						rows = append(rows, row)
					}
				}
			}
		}
	}
	return rows, nil
}

// benchOnce runs one test over prov, every size, against a local server
// of its own.
func benchOnce(ctx context.Context, prov, mode string, sizes []uint64, iters, warmup, window int,
	timeout time.Duration, stderr io.Writer) ([]perftest.Row, error) {
	maxSize := uint64(0)
	for _, s := range sizes {
		maxSize = max(maxSize, s)
	}
	addr, stopServer, err := startLocalServer(prov, 2*maxSize, stderr)
	if err != nil {
		return nil, err
	}
	defer stopServer()
	mf := managerFlags{providers: prov, poll: "busy", timeout: timeout}
	m, err := mf.open(ctx)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return runSession(ctx, perftest.Config{Server: addr, Manager: m, Mode: mode, Sizes: sizes, Iters: iters,
		Warmup: warmup, WarmupFor: warmupFor(warmup), Window: window, Timeout: timeout, Token: os.Getenv(tokenEnv)})
}

// aggregate makes one row per size out of repeated runs: ours[i] and
// theirs[i] (when not nil) are the rows of repeat i, in size order.
func aggregate(ours [][]perftest.Row, theirs [][]peerResult) []benchRow {
	var rows []benchRow
	for k := range ours[0] {
		var same []perftest.Row
		var mbs []float64
		for _, r := range ours {
			same = append(same, r[k])
			mbs = append(mbs, r[k].MBps)
		}
		row := benchRow{Row: medianRow(same), Repeats: len(ours), MBpsMin: slices.Min(mbs), MBpsMax: slices.Max(mbs)}
		if theirs != nil {
			comparePeer(&row, ours, theirs, k)
		}
		rows = append(rows, row)
	}
	return rows
}

// comparePeer fills in the peer tool's figures for size k.
func comparePeer(row *benchRow, ours [][]perftest.Row, theirs [][]peerResult, k int) {
	var mbs, usecs, ratios []float64
	for i, pr := range theirs {
		p := pr[k]
		row.Peer = p.tool
		switch {
		case p.tool == "":
			return
		case p.err != nil:
			row.PeerError = oneLine(p.err)
			return
		}
		// runPeerTool fails a run that reports no MB/sec: p.mbps > 0.
		mbs, usecs = append(mbs, p.mbps), append(usecs, p.usec)
		ratios = append(ratios, ours[i][k].MBps/p.mbps)
	}
	row.PeerMBps, row.PeerUsec = median(mbs), median(usecs)
	row.PeerMBpsMin, row.PeerMBpsMax = slices.Min(mbs), slices.Max(mbs)
	row.Ratio, row.RatioMin, row.RatioMax = median(ratios), slices.Min(ratios), slices.Max(ratios)
}

// startLocalServer runs `fitransfer serve` for prov on a free loopback
// port and returns its address.
func startLocalServer(prov string, size uint64, stderr io.Writer) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	n := strconv.FormatUint(size, 10)
	cmd := exec.Command(exe, "serve", "--listen", "127.0.0.1:0", "-p", prov, "--size", n, "--max-memory", n)
	cmd.Stderr = stderr
	return startServeCmd(cmd, "local "+prov)
}

// startServeCmd starts cmd, a `fitransfer serve` (what names it in
// errors), and returns the address its first line says it listens on,
// and a func that stops it.
func startServeCmd(cmd *exec.Cmd, what string) (string, func(), error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case l, ok := <-line:
		if f := strings.Fields(l); ok && len(f) >= 3 && f[0] == "listening" {
			return f[2], stop, nil
		}
		stop()
		return "", nil, fmt.Errorf("%s server did not start (%q)", what, l)
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("%s server did not start within 30s", what)
	}
}

// printBench prints the table, or CSV. With repeat > 1 the table adds
// the range of the per-repeat ratios, and CSV the range of every median.
func printBench(w io.Writer, rows []benchRow, asCSV, compare bool, repeat int) {
	ranges := repeat > 1
	head := []string{"provider", "test", "bytes", "iters", "window", "MB/sec", "usec/xfer", "Mxfers/sec", "p50 usec", "p99 usec"}
	if ranges && asCSV {
		head = append(head, "MB/sec min", "MB/sec max")
	}
	if compare {
		head = append(head, "peer tool", "peer MB/sec", "peer usec/xfer", "ratio")
		switch {
		case ranges && asCSV:
			head = append(head, "peer MB/sec min", "peer MB/sec max", "ratio min", "ratio max")
		case ranges:
			head = append(head, "ratio range")
		}
	}
	line := func(r benchRow) []string {
		l := []string{r.Provider, r.Op, perftest.SizeString(r.Bytes), perftest.CountString(int64(r.Iters)), strconv.Itoa(r.Window),
			f2(r.MBps), f2(r.UsecPerXfer), f2(r.MxfersPerS), f2(r.P50Usec), f2(r.P99Usec)}
		if ranges && asCSV {
			l = append(l, f2(r.MBpsMin), f2(r.MBpsMax))
		}
		if !compare {
			return l
		}
		measured := r.Peer != "" && r.PeerError == ""
		switch {
		case r.Peer == "":
			l = append(l, "-", "", "", "")
		case r.PeerError != "":
			l = append(l, r.Peer, "("+r.PeerError+")", "", "")
		default:
			l = append(l, r.Peer, f2(r.PeerMBps), f2(r.PeerUsec), f2(r.Ratio))
		}
		switch {
		case ranges && asCSV && measured:
			l = append(l, f2(r.PeerMBpsMin), f2(r.PeerMBpsMax), f2(r.RatioMin), f2(r.RatioMax))
		case ranges && asCSV:
			l = append(l, "", "", "", "")
		case ranges && measured:
			l = append(l, f2(r.RatioMin)+"-"+f2(r.RatioMax))
		case ranges:
			l = append(l, "")
		}
		return l
	}
	var lines [][]string
	for _, r := range rows {
		lines = append(lines, line(r))
	}
	writeTable(w, head, lines, asCSV)
}

// writeTable prints head and lines as CSV, or as a table with the
// columns aligned right.
func writeTable(w io.Writer, head []string, lines [][]string, asCSV bool) {
	if asCSV {
		cw := csv.NewWriter(w)
		_ = cw.Write(head)
		_ = cw.WriteAll(lines)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, l := range lines {
		fmt.Fprintln(tw, strings.Join(l, "\t")+"\t")
	}
	tw.Flush()
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// medianRow is the row with the median MB/sec: with an even count, the
// lower of the two middle ones.
func medianRow(rows []perftest.Row) perftest.Row {
	s := append([]perftest.Row(nil), rows...)
	sort.Slice(s, func(i, j int) bool { return s[i].MBps < s[j].MBps })
	return s[(len(s)-1)/2]
}

// median is the median of v: with an even count, the lower of the two
// middle values, as medianRow.
func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[(len(s)-1)/2]
}

// peerTools runs the peer tool that measures what a row of ours
// measures, with the same size, window and iterations.
type peerTools struct {
	fabtestsDir    string
	warmup, window int
	timeout        time.Duration
	exe            string // this program, which the floor starts as its peer (floor.ServePeer)
}

// peerResult is one run of a peer tool; tool is empty when no peer tool
// measures that test here.
type peerResult struct {
	tool       string // as the table names it
	mbps, usec float64
	err        error
}

// plainWriteMin: writes from this size on are also compared with
// fi_rma_bw without -U (transmit complete; on shm, CMA underneath), the
// way fabtests measures them by default.
const plainWriteMin = 64 << 10

// second reports whether r, a row of ours, is also compared with a second
// peer tool: a write from plainWriteMin with fi_rma_bw without -U; a
// pingpong with fi_rma_pingpong -U -j 0, an RMA write pingpong whose
// writes are each delivery complete, with a completion (on tcp the target
// acknowledges each; ours ask only that the source may be reused, and
// take no acknowledgement), where fabtests has it (from libfabric 1.21).
// fi_rdm_pingpong, the first, sends messages.
func (p *peerTools) second(r perftest.Row) bool {
	switch {
	case p.fabtestsDir == "":
		return false
	case r.Op == "write":
		return r.Bytes >= plainWriteMin
	case r.Op == "pingpong":
		_, err := os.Stat(filepath.Join(p.fabtestsDir, "fi_rma_pingpong"))
		return err == nil
	}
	return false
}

// floorName is how the table names the raw-endpoint floor.
const floorName = "raw floor (internal/floor)"

// hasFloor reports whether r, a row of ours, is also compared with the
// floor under it: 8 B window-1 reads and writes, and 8 B pingpongs, over
// shm and tcp;ofi_rxm. The same ops on raw endpoints with no engine
// (internal/floor): ours over it is what the engine costs, in the same
// run.
func (p *peerTools) hasFloor(r perftest.Row) bool {
	return r.Bytes == 8 && (r.Provider == string(fabric.BackendSHM) || r.Provider == string(fabric.BackendTCP)) &&
		(r.Op == "pingpong" || r.Window == 1 && (r.Op == "read" || r.Op == "write"))
}

// runFloor measures the floor under r (hasFloor), with r's iterations.
func (p *peerTools) runFloor(ctx context.Context, r perftest.Row) peerResult {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	usec, err := floor.Measure(ctx, p.exe, nil, r.Provider, floor.Test(r.Op), r.Iters, floorFlags(r))
	if err != nil {
		return peerResult{tool: floorName, err: err}
	}
	return peerResult{tool: floorName, mbps: float64(r.Bytes) / usec, usec: usec}
}

// floorFlags is the completion fitransfer's writes of r ask for, as its
// routes pick it (libfabric.CompletionOver and WriteFlagsOver): bench's
// owner is a verified process of this node that process_vm_readv
// reaches, its pingpongs' writes are Action.InjectComplete, and the
// floor opens shm as transport does (floor.Hints).
func floorFlags(r perftest.Row) fabric.OpFlags {
	prov := fabric.Backend(r.Provider)
	ownerCopies := prov == fabric.BackendSHM && libfabric.ShmOwnerCopies(floor.Hints(r.Provider))
	want := libfabric.CompletionOver(prov, ownerCopies, false, r.Op == "pingpong", r.Bytes)
	return fabric.OpFlags(libfabric.WriteFlagsOver(prov, want, true, true))
}

// run measures with the peer tool what r measured; second: with the
// second peer tool (peerTools.second).
func (p *peerTools) run(ctx context.Context, r perftest.Row, second bool) peerResult {
	tool, args, name := p.command(r, second)
	if tool == "" {
		return peerResult{} // no peer tool measures RMA bandwidth without fabtests
	}
	res := peerResult{tool: name}
	res.mbps, res.usec, res.err = runPeerTool(ctx, tool, args, p.timeout)
	return res
}

// command is the peer tool's command line for what r measured, and how
// the table names it; "" when no peer tool measures it here. second: the
// second peer tool (peerTools.second).
func (p *peerTools) command(r perftest.Row, second bool) (tool string, args []string, name string) {
	n := r.Iters
	size := strconv.FormatUint(r.Bytes, 10)
	switch {
	case r.Op == "pingpong" && p.fabtestsDir != "" && second:
		tool, args = filepath.Join(p.fabtestsDir, "fi_rma_pingpong"), []string{"-e", "rdm", "-o", "write", "-S", size,
			"-I", strconv.Itoa(n), "-w", strconv.Itoa(p.warmup)}
	case r.Op == "pingpong" && p.fabtestsDir != "":
		tool, args = filepath.Join(p.fabtestsDir, "fi_rdm_pingpong"), []string{"-S", size, "-I", strconv.Itoa(n), "-w", strconv.Itoa(p.warmup)}
	case r.Op == "pingpong":
		tool, args = "fi_pingpong", []string{"-e", "rdm", "-S", size, "-I", strconv.Itoa(n)}
	case p.fabtestsDir != "":
		tool, args = filepath.Join(p.fabtestsDir, "fi_rma_bw"), []string{"-e", "rdm", "-o", r.Op, "-S", size,
			"-W", strconv.Itoa(p.window), "-I", strconv.Itoa(n), "-w", strconv.Itoa(p.warmup)}
	default:
		return "", nil, ""
	}
	name = filepath.Base(tool)
	// The peer tool's writes as ours (unless it is the second for writes:
	// fi_rma_bw as fabtests runs it by default).
	if p.fabtestsDir != "" && (r.Op == "write" && !second || r.Op == "pingpong" && second) {
		// fitransfer's writes are each delivery complete and signaled
		// (the pingpong's are signaled, and complete once their source
		// may be reused: fi_rma_pingpong has no such option). -U alone
		// does not make fabtests' the same: they post writes under the
		// inject size with fi_inject_write, which has no completion at
		// all; -j 0 turns that off.
		args = append(args, "-U", "-j", "0")
		name += " -U -j 0"
	}
	prov := r.Provider
	if prov == "cma" || prov == "mem" {
		prov = "shm" // the peer tools' same-node provider
		name += " (shm)"
	}
	return tool, append([]string{"-p", prov}, args...), name
}

// runPeerTool runs a fabtests-style tool as server and client on
// loopback and parses the client's last result line (its MB/sec and
// usec/xfer columns). A run whose server exited before its client got
// through (its port taken: fi_pingpong's default control port is in the
// ephemeral range, so any connection may hold it) is tried again, on
// another port, up to three times.
func runPeerTool(ctx context.Context, tool string, args []string, timeout time.Duration) (float64, float64, error) {
	if _, err := exec.LookPath(tool); err != nil {
		return 0, 0, fmt.Errorf("%s not found", tool)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		mbps, usec, err := peerToolOnce(ctx, tool, args)
		if !errors.Is(err, errPeerServerGone) || attempt == 3 {
			if ctx.Err() != nil && err != nil {
				err = fmt.Errorf("%s did not finish within %s: %w", filepath.Base(tool), timeout, err)
			}
			return mbps, usec, err
		}
	}
}

// errPeerServerGone is a peer tool's server that exited before its client
// connected.
var errPeerServerGone = errors.New("its server exited before the client connected")

// peerToolOnce is one server and client run of runPeerTool.
func peerToolOnce(ctx context.Context, tool string, args []string) (float64, float64, error) {
	name := filepath.Base(tool)
	srvArgs := slices.Concat(args, []string{"-s", "127.0.0.1"})
	cliArgs := slices.Concat(args, []string{"-s", "127.0.0.1", "127.0.0.1"})
	if name == "fi_pingpong" {
		port, err := freeTCPPort()
		if err != nil {
			return 0, 0, err
		}
		srvArgs = slices.Concat(args, []string{"-B", port})
		cliArgs = slices.Concat(args, []string{"-P", port, "127.0.0.1"})
	}
	srv := exec.CommandContext(ctx, tool, srvArgs...)
	var srvErr bytes.Buffer
	srv.Stderr = &srvErr
	if err := srv.Start(); err != nil {
		return 0, 0, err
	}
	srvDone := make(chan struct{})
	go func() { _ = srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone:
		default:
			_ = srv.Process.Kill()
			<-srvDone
		}
	}()
	// The client connects to the server's control port; until the
	// server listens there it exits at once with ECONNREFUSED (111):
	// try again until it is up or has exited, instead of guessing how
	// long that takes.
	var out []byte
	var err error
	retry := time.NewTimer(0)
	defer retry.Stop()
	for refused := true; refused; {
		select {
		case <-srvDone:
			return 0, 0, fmt.Errorf("%s: %w: %s", name, errPeerServerGone, lastLine(srvErr.String()))
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("%s: %w", name, ctx.Err())
		case <-retry.C:
		}
		out, err = exec.CommandContext(ctx, tool, cliArgs...).Output()
		var ee *exec.ExitError
		refused = errors.As(err, &ee) && ee.ExitCode() == int(syscall.ECONNREFUSED)
		retry.Reset(50 * time.Millisecond)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %v", name, err)
	}
	line := lastLine(string(out))
	f := strings.Fields(line)
	if len(f) < 4 {
		return 0, 0, fmt.Errorf("%s printed %q", name, line)
	}
	mbps, err1 := strconv.ParseFloat(f[len(f)-3], 64)
	usec, err2 := strconv.ParseFloat(f[len(f)-2], 64)
	if err1 == nil && err2 == nil && mbps == 0 && usec > 0 {
		// Two decimals print a slow small transfer's rate as 0.00 (an
		// 8 B pingpong at 800 usec): its size over usec/xfer is the rate.
		if sz, err := perftest.ParseSizes(f[0]); err == nil && len(sz) == 1 {
			mbps = float64(sz[0]) / usec
		}
	}
	if err1 != nil || err2 != nil || mbps <= 0 {
		return 0, 0, fmt.Errorf("%s printed %q", name, line)
	}
	// The server ends by itself once its client has: the next run
	// starts with the machine to itself.
	select {
	case <-srvDone:
	case <-ctx.Done():
	}
	return mbps, usec, nil
}

// freeTCPPort is a loopback port the kernel just handed out and nobody
// holds now.
func freeTCPPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
