package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/perftest"
	"github.com/fitransfer/fitransfer/transport"
)

// benchRow is one line of the bench table: our figures and, with
// --compare, the peer tool's for the same provider, op, size, window and
// iterations.
type benchRow struct {
	perftest.Row
	Peer      string  `json:"peer,omitempty"`
	PeerMBps  float64 `json:"peer_mb_per_sec,omitempty"`
	PeerUsec  float64 `json:"peer_usec_per_xfer,omitempty"`
	Ratio     float64 `json:"ratio,omitempty"` // ours / peer, MB/sec
	PeerError string  `json:"peer_error,omitempty"`
}

func runBench(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fitransfer bench", flag.ContinueOnError)
	providers := fs.String("providers", "", "providers to sweep, comma-separated (default: every usable one of cma, shm, tcp;ofi_rxm, efa)")
	sizes := fs.String("S", "8,4k,64k,1m", "sizes (as read/write -S, or a comma-separated list)")
	iters := fs.Int("I", 0, "iterations per size (default: fabtests' per size)")
	warmup := fs.Int("w", 10, "warm-up iterations per size")
	window := fs.Int("W", 64, "window for read and write")
	ops := fs.String("ops", "read,write,pingpong", "tests to run")
	asCSV := fs.Bool("csv", false, "print CSV")
	compare := fs.Bool("compare", false, "run the peer tools too, side by side: fi_pingpong (libfabric-bin), and fi_rma_bw / fi_rdm_pingpong from $FABTESTS_BIN")
	fabtests := fs.String("fabtests", os.Getenv("FABTESTS_BIN"), "directory holding fabtests' fi_rma_bw and fi_rdm_pingpong")
	timeout := fs.Duration("timeout", 60*time.Second, "deadline of each transfer and of each peer tool run")
	repeat := fs.Int("repeat", 1, "run every measurement this many times and keep the median (MB/sec), for ours and the peer tools alike")
	fs.Usage = defaultUsage(fs, "[flags]")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	sz, err := perftest.ParseSizes(*sizes)
	if err != nil {
		return fail(stderr, "bench", usageError{fmt.Errorf("-S: %w", err)})
	}
	provs, err := benchProviders(*providers)
	if err != nil {
		return fail(stderr, "bench", err)
	}
	ctx, stop := interruptible()
	defer stop()
	var rows []benchRow
	if *repeat < 1 {
		return fail(stderr, "bench", usageError{errors.New("--repeat must be >= 1")})
	}
	for _, prov := range provs {
		r, err := benchProvider(ctx, prov, strings.Split(*ops, ","), sz, *iters, *warmup, *window, *repeat, *timeout, stderr)
		rows = append(rows, r...)
		if err != nil {
			printBench(stdout, rows, *asCSV, *compare)
			if ctx.Err() != nil {
				return exitInterrupted
			}
			return fail(stderr, "bench", fmt.Errorf("%s: %w", prov, err))
		}
	}
	if *compare {
		for i := range rows {
			comparePeer(ctx, &rows[i], *warmup, *window, *repeat, *fabtests, *timeout)
		}
	}
	printBench(stdout, rows, *asCSV, *compare)
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

// benchProvider starts a local server process for prov and runs the tests
// against it from this process.
func benchProvider(ctx context.Context, prov string, ops []string, sizes []uint64, iters, warmup, window, repeat int,
	timeout time.Duration, stderr io.Writer) ([]benchRow, error) {
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
	var rows []benchRow
	for _, op := range ops {
		mode := map[string]string{"read": bootstrap.ModeRead, "write": bootstrap.ModeWrite, "pingpong": bootstrap.ModePingPong}[op]
		if mode == "" {
			return rows, usageError{fmt.Errorf("--ops: unknown test %q (read, write, pingpong)", op)}
		}
		cfg := perftest.Config{Server: addr, Manager: m, Mode: mode, Sizes: sizes, Iters: iters, Warmup: warmup,
			Window: window, Timeout: timeout}
		runs := make([][]perftest.Row, 0, repeat)
		for i := 0; i < repeat; i++ {
			r, err := runSession(ctx, cfg)
			if err != nil {
				for _, row := range r {
					rows = append(rows, benchRow{Row: row})
				}
				return rows, err
			}
			runs = append(runs, r)
		}
		for i := range runs[0] {
			var same []perftest.Row
			for _, r := range runs {
				same = append(same, r[i])
			}
			rows = append(rows, benchRow{Row: medianRow(same)})
		}
	}
	return rows, nil
}

// startLocalServer runs `fitransfer serve` for prov on a free loopback
// port and returns its address.
func startLocalServer(prov string, size uint64, stderr io.Writer) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(exe, "serve", "--listen", "127.0.0.1:0", "-p", prov, "--size", strconv.FormatUint(size, 10))
	cmd.Stderr = stderr
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
		return "", nil, fmt.Errorf("local %s server did not start (%q)", prov, l)
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, fmt.Errorf("local %s server did not start within 30s", prov)
	}
}

func printBench(w io.Writer, rows []benchRow, asCSV, compare bool) {
	head := []string{"provider", "test", "bytes", "iters", "window", "MB/sec", "usec/xfer", "Mxfers/sec", "p50 usec", "p99 usec"}
	if compare {
		head = append(head, "peer tool", "peer MB/sec", "peer usec/xfer", "ratio")
	}
	line := func(r benchRow) []string {
		l := []string{r.Provider, r.Op, perftest.SizeString(r.Bytes), perftest.CountString(int64(r.Iters)), strconv.Itoa(r.Window),
			f2(r.MBps), f2(r.UsecPerXfer), f2(r.MxfersPerS), f2(r.P50Usec), f2(r.P99Usec)}
		if compare {
			switch {
			case r.Peer == "":
				l = append(l, "-", "", "", "")
			case r.PeerError != "":
				l = append(l, r.Peer, "("+r.PeerError+")", "", "")
			default:
				l = append(l, r.Peer, f2(r.PeerMBps), f2(r.PeerUsec), f2(r.Ratio))
			}
		}
		return l
	}
	if asCSV {
		cw := csv.NewWriter(w)
		_ = cw.Write(head)
		for _, r := range rows {
			_ = cw.Write(line(r))
		}
		cw.Flush()
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(line(r), "\t")+"\t")
	}
	tw.Flush()
}

func f2(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }

// medianRow is the row with the median MB/sec.
func medianRow(rows []perftest.Row) perftest.Row {
	s := append([]perftest.Row(nil), rows...)
	sort.Slice(s, func(i, j int) bool { return s[i].MBps < s[j].MBps })
	return s[len(s)/2]
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// comparePeer runs the peer tool that measures what r measures, with the
// same size, window and iterations, and fills in its figures.
func comparePeer(ctx context.Context, r *benchRow, warmup, window, repeat int, fabtestsDir string, timeout time.Duration) {
	n := r.Iters
	size := strconv.FormatUint(r.Bytes, 10)
	var tool string
	var args []string
	switch {
	case r.Op == "pingpong" && fabtestsDir != "":
		tool, args = filepath.Join(fabtestsDir, "fi_rdm_pingpong"), []string{"-S", size, "-I", strconv.Itoa(n), "-w", strconv.Itoa(warmup)}
	case r.Op == "pingpong":
		tool, args = "fi_pingpong", []string{"-e", "rdm", "-S", size, "-I", strconv.Itoa(n)}
	case fabtestsDir != "":
		tool, args = filepath.Join(fabtestsDir, "fi_rma_bw"), []string{"-e", "rdm", "-o", r.Op, "-S", size,
			"-W", strconv.Itoa(window), "-I", strconv.Itoa(n), "-w", strconv.Itoa(warmup)}
		if r.Op == "write" {
			// fitransfer's writes are each delivery complete and signaled.
			// -U alone does not make fi_rma_bw's the same: it posts writes
			// under the inject size with fi_inject_write, which has no
			// completion at all; -j 0 turns that off.
			args = append(args, "-U", "-j", "0")
		}
	default:
		return // no peer tool measures RMA bandwidth without fabtests
	}
	r.Peer = filepath.Base(tool)
	if r.Op == "write" && fabtestsDir != "" {
		r.Peer += " -U -j 0"
	}
	prov := r.Provider
	if prov == "cma" {
		prov = "shm" // the peer tools' same-node provider
		r.Peer += " (shm)"
	}
	var mbs, usecs []float64
	for i := 0; i < repeat; i++ {
		mbps, usec, err := runPeerTool(ctx, tool, append([]string{"-p", prov}, args...), timeout)
		if err != nil {
			r.PeerError = oneLine(err)
			return
		}
		mbs, usecs = append(mbs, mbps), append(usecs, usec)
	}
	mbps := median(mbs)
	r.PeerMBps, r.PeerUsec = mbps, median(usecs)
	if mbps > 0 {
		r.Ratio = r.MBps / mbps
	}
}

// runPeerTool runs a fabtests-style tool as server and client on
// loopback and parses the client's last result line (its MB/sec and
// usec/xfer columns).
func runPeerTool(ctx context.Context, tool string, args []string, timeout time.Duration) (float64, float64, error) {
	if _, err := exec.LookPath(tool); err != nil {
		return 0, 0, fmt.Errorf("%s not found", tool)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	local := []string{"-s", "127.0.0.1"}
	if filepath.Base(tool) == "fi_pingpong" {
		local = nil
	}
	srv := exec.CommandContext(ctx, tool, append(append([]string{}, args...), local...)...)
	if err := srv.Start(); err != nil {
		return 0, 0, err
	}
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	time.Sleep(700 * time.Millisecond)
	cli := exec.CommandContext(ctx, tool, append(append(append([]string{}, args...), local...), "127.0.0.1")...)
	out, err := cli.Output()
	if err != nil {
		return 0, 0, fmt.Errorf("%s: %v", filepath.Base(tool), err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 4 {
		return 0, 0, fmt.Errorf("%s printed %q", filepath.Base(tool), lines[len(lines)-1])
	}
	mbps, err1 := strconv.ParseFloat(f[len(f)-3], 64)
	usec, err2 := strconv.ParseFloat(f[len(f)-2], 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("%s printed %q", filepath.Base(tool), lines[len(lines)-1])
	}
	time.Sleep(300 * time.Millisecond)
	return mbps, usec, nil
}
