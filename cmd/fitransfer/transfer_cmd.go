package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/perftest"
)

// testFlags are fabtests' options shared by read, write and pingpong.
type testFlags struct {
	managerFlags
	sizes    string
	iters    int
	warmup   int
	window   int
	delivery bool
	verify   bool
	asJSON   bool
	cpuProf  string
	token    string
}

func (f *testFlags) register(fs *flag.FlagSet, bandwidth bool) {
	f.managerFlags.register(fs, "busy")
	fs.StringVar(&f.sizes, "S", "", "size: N[k|m|g], all, or r:start,inc,end (default: 64 256 1k 4k 64k 1m)")
	fs.IntVar(&f.iters, "I", 0, "iterations per size (default: fabtests' per size)")
	fs.IntVar(&f.warmup, "w", 10, warmupUsage)
	fs.BoolVar(&f.verify, "v", false, "check every byte")
	fs.BoolVar(&f.verify, "verify", false, "check every byte")
	fs.BoolVar(&f.asJSON, "m", false, "machine-readable output (JSON)")
	fs.BoolVar(&f.asJSON, "json", false, "machine-readable output (JSON)")
	fs.StringVar(&f.cpuProf, "cpuprofile", "", "write a pprof CPU profile of the run to this file")
	fs.StringVar(&f.token, "token", "", "the server's shared secret, when it has one (default $FITRANSFER_TOKEN)")
	if bandwidth {
		fs.IntVar(&f.window, "W", 64, "window: ops in flight")
		fs.BoolVar(&f.delivery, "U", true, "writes complete when the data is at the target (FI_DELIVERY_COMPLETE; default)")
		fs.BoolVar(&f.transmitComplete, "transmit-complete", false, "writes complete when the data left (FI_TRANSMIT_COMPLETE; weaker)")
	}
}

func runRead(args []string, stdout, stderr io.Writer) int {
	return runTest("read", bootstrap.ModeRead, args, stdout, stderr)
}

func runWrite(args []string, stdout, stderr io.Writer) int {
	return runTest("write", bootstrap.ModeWrite, args, stdout, stderr)
}

func runPingPong(args []string, stdout, stderr io.Writer) int {
	return runTest("pingpong", bootstrap.ModePingPong, args, stdout, stderr)
}

// testFlagSet is the flag set of read, write or pingpong (name; mode is
// its bootstrap mode) and the flags it fills.
func testFlagSet(name, mode string) (*flag.FlagSet, *testFlags) {
	fs := flag.NewFlagSet("fitransfer "+name, flag.ContinueOnError)
	f := &testFlags{}
	f.register(fs, mode != bootstrap.ModePingPong)
	fs.Usage = defaultUsage(fs, "HOST[:PORT] [flags]")
	return fs, f
}

// runTest is read, write and pingpong: connect to HOST[:PORT], measure,
// print fabtests' columns.
func runTest(name, mode string, args []string, stdout, stderr io.Writer) int {
	fs, f := testFlagSet(name, mode)
	pos, code, ok := parseArgs(fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "fitransfer %s: want one HOST[:PORT] (the `fitransfer serve` host), got %d arguments\n", name, len(pos))
		return exitUsage
	}
	if !f.delivery && !f.transmitComplete && mode == bootstrap.ModeWrite {
		f.transmitComplete = true // -U=false
	}
	sizes, err := perftest.ParseSizes(f.sizes)
	if err != nil {
		return fail(stderr, name, usageError{fmt.Errorf("-S: %w", err)})
	}
	if f.iters < 0 || f.warmup < 0 || (mode != bootstrap.ModePingPong && f.window < 1) {
		return fail(stderr, name, usageError{errors.New("-I, -w must be >= 0 and -W >= 1")})
	}
	ctx, stop := interruptible()
	defer stop()
	if f.source == "" {
		f.source = sourceToward(hostPort(pos[0]))
	}
	m, err := f.open(ctx)
	if err != nil {
		return fail(stderr, name, err)
	}
	defer m.Close()
	if f.cpuProf != "" {
		stopProf, err := startCPUProfile(f.cpuProf)
		if err != nil {
			return fail(stderr, name, err)
		}
		defer stopProf()
	}
	bar := newProgress(stderr, name)
	cfg := perftest.Config{Server: hostPort(pos[0]), Manager: m, Mode: mode, Sizes: sizes, Iters: f.iters,
		Warmup: f.warmup, WarmupFor: warmupFor(f.warmup), Window: f.window, Verify: f.verify, Timeout: f.timeout, Progress: bar.update, Info: stderr,
		Token: cmp.Or(f.token, os.Getenv(tokenEnv))}
	rows, err := runSession(ctx, cfg)
	bar.clear()
	if len(rows) > 0 {
		printRows(stdout, rows, f.asJSON)
	}
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintf(stderr, "fitransfer %s: interrupted; the rows above are what was measured\n", name)
			return exitInterrupted
		}
		return fail(stderr, name, err)
	}
	return exitOK
}

// runSession connects and runs the test of cfg.Mode.
func runSession(ctx context.Context, cfg perftest.Config) (_ []perftest.Row, err error) {
	var pp *perftest.PingPongBuffer
	var hello bootstrap.Message
	if cfg.Mode == bootstrap.ModePingPong {
		if pp, err = perftest.NewPingPongBuffer(cfg); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				pp.CloseLater() // report the failure now, not after Close's wait
				return
			}
			_ = pp.Close()
		}()
		hello = pp.Hello()
	}
	s, err := perftest.Connect(cfg, hello)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if err := s.CheckSizes(); err != nil {
		return nil, err
	}
	if cfg.Info != nil {
		fmt.Fprintf(cfg.Info, "%s %s over %s: peer %s (%s)\n", cfg.Mode, cfg.Server, s.Route.Backend, s.Route.Peer, s.Route.Locality)
	}
	if pp != nil {
		return s.RunPingPong(ctx, pp)
	}
	return s.RunBandwidth(ctx)
}

func printRows(w io.Writer, rows []perftest.Row, asJSON bool) {
	if asJSON {
		_ = writeJSON(w, rows)
		return
	}
	perftest.WriteHeader(w)
	for _, r := range rows {
		fmt.Fprintln(w, r)
		if l := r.RailLine(); l != "" {
			fmt.Fprintln(w, l)
		}
	}
}

// progressBar draws a one-line progress bar on a terminal stderr, for runs
// longer than a second; nothing when stderr is not a terminal.
type progressBar struct {
	w       io.Writer
	name    string
	on      bool
	start   time.Time
	last    time.Time
	printed bool
}

func newProgress(w io.Writer, name string) *progressBar {
	f, ok := w.(*os.File)
	return &progressBar{w: w, name: name, on: ok && isTerminal(f), start: time.Now()}
}

func (p *progressBar) update(size uint64, done, total int) {
	if !p.on || time.Since(p.start) < time.Second || time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	const width = 30
	fill := done * width / max(total, 1)
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = ' '
		if i < fill {
			bar[i] = '#'
		}
	}
	fmt.Fprintf(p.w, "\r%s %-6s [%s] %3d%% (%d/%d)", p.name, perftest.SizeString(size), bar, done*100/max(total, 1), done, total)
	p.printed = true
}

func (p *progressBar) clear() {
	if p.printed {
		fmt.Fprintf(p.w, "\r%80s\r", "")
	}
}

// sourceToward is the local address this host sends from to reach the
// server at addr: a client's data follows its control connection, as the
// server's does, so that the server reaches the client's endpoint (it
// writes there in a pingpong) the way the client reached it. "" when
// the kernel knows no route; libfabric then picks an interface.
func sourceToward(addr string) string {
	c, err := net.Dial("udp", addr) // connect(2) on UDP picks the route and sends nothing
	if err != nil {
		return ""
	}
	defer c.Close()
	host, _, err := net.SplitHostPort(c.LocalAddr().String())
	if err != nil {
		return ""
	}
	return host
}

// warmupUsage is -w's help.
var warmupUsage = fmt.Sprintf("warm-up iterations per size; with any, the warm-up also lasts at least %v, so that the Go runtime settles (0: no warm-up)", perftest.DefaultWarmupFor)

// warmupFor is the warm-up time that goes with -w n: none for -w 0.
func warmupFor(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	return perftest.DefaultWarmupFor
}
