package fabric

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fitransfer/fitransfer/internal/ofi"
)

// probeChildEnv marks a process started as the EFA probe child; its value
// is the plan (probePlan.encode).
const probeChildEnv = "FITRANSFER_EFA_PROBE"

// probeTimeout bounds a probe child: provider init, fi_getinfo and one
// endpoint per EFA device.
const probeTimeout = 60 * time.Second

// The calls a probe child makes, in order. Each is one of the libfabric
// calls that can abort() the process.
const (
	stepGetInfo   = "getinfo"      // fi_getinfo for efa RDM: 1.17 runs efa's provider init here
	stepHMEM      = "getinfo-hmem" // fi_getinfo for efa RDM with FI_HMEM (1.18+)
	stepEndpoints = "endpoints"    // fi_endpoint on every efa RDM domain, and fi_getopt (1.18+)
	stepAbort     = "abort"        // tests only: abort() as libfabric does
)

// init runs the probe child before anything else in a process started as
// one. Package init comes before main and TestMain of every binary that
// links this package, so neither the CLI nor a test binary needs wiring,
// and a library user's main never runs in the child.
func init() {
	if plan, ok := os.LookupEnv(probeChildEnv); ok {
		os.Exit(probeChild(os.Stdout, os.Stderr, plan))
	}
	ofi.BeforeEFAEndpoint = guardEFAEndpoint
}

type probePlan struct {
	api   Version
	steps []string
}

func (p probePlan) encode() string {
	return "api=" + p.api.String() + ";steps=" + strings.Join(p.steps, ",")
}

func decodePlan(s string) (probePlan, error) {
	var p probePlan
	for _, kv := range strings.Split(s, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "api":
			if err := p.api.UnmarshalText([]byte(v)); err != nil {
				return p, err
			}
		case "steps":
			p.steps = strings.Split(v, ",")
		}
	}
	if p.api == 0 || len(p.steps) == 0 {
		return p, fmt.Errorf("probe plan %q: want api=M.m;steps=a,b", s)
	}
	return p, nil
}

// probeChild makes the plan's libfabric calls and reports each on out:
// "call X" before it, "ok X" after it, "domain D" for each efa RDM domain,
// "rma D READ WRITE" with fi_getopt's answer, "done" at the end. An
// abort() kills the process by SIGABRT: the parent sees which call was in
// progress and what libfabric printed on stderr.
func probeChild(out, errOut io.Writer, planText string) int {
	// Go's runtime turns SIGABRT into a crash dump and exit status 2; with
	// the signal ignored, abort() resets it and the process dies by it, which
	// the parent reads from the wait status.
	signal.Ignore(syscall.SIGABRT)
	plan, err := decodePlan(planText)
	if err != nil {
		fmt.Fprintln(out, "error plan:", err)
		return 2
	}
	var infos []Info
	for _, step := range plan.steps {
		switch step {
		case stepGetInfo, stepHMEM:
			h := RMAHints("efa")
			call := "fi_getinfo"
			if step == stepHMEM {
				WithHMEM(h)
				call = "fi_getinfo with FI_HMEM"
			}
			fmt.Fprintln(out, "call", call)
			got, err := ofi.GetInfo(plan.api, "", "", 0, h)
			fmt.Fprintln(out, "ok", call)
			if err != nil && !errors.Is(err, ErrNoData) {
				fmt.Fprintln(out, "error", call+":", err)
			}
			if step == stepGetInfo {
				infos = got
				for i := range infos {
					if isEFARDM(&infos[i]) {
						fmt.Fprintln(out, "domain", infos[i].Domain.Name)
					}
				}
			}
		case stepEndpoints:
			for i := range infos {
				if isEFARDM(&infos[i]) {
					probeEndpoint(out, plan.api, &infos[i])
				}
			}
		case stepAbort:
			fmt.Fprintln(out, "call abort (test)")
			fmt.Fprintln(errOut, "fitransfer probe child: abort() requested by a test")
			ofi.Abort()
		default:
			fmt.Fprintln(out, "error plan: unknown step", step)
			return 2
		}
	}
	fmt.Fprintln(out, "done")
	return 0
}

// probeEndpoint opens an endpoint on in's domain and asks whether RMA is
// emulated, reporting "rma DOMAIN READ WRITE" (yes: on the device).
func probeEndpoint(out io.Writer, api Version, in *Info) {
	name := in.Domain.Name
	call := "efa endpoint open (" + name + ")"
	f, err := OpenFabric(in)
	if err != nil {
		fmt.Fprintln(out, "error", call+":", err)
		return
	}
	defer f.Close()
	d, err := f.OpenDomain(in)
	if err != nil {
		fmt.Fprintln(out, "error", call+":", err)
		return
	}
	defer d.Close()
	fmt.Fprintln(out, "call", call)
	if !ofi.CompiledVersion().AtLeast(1, 18) || !api.AtLeast(1, 18) {
		err := d.TryEndpoint()
		fmt.Fprintln(out, "ok", call)
		if err != nil {
			fmt.Fprintln(out, "error", call+":", err)
			return
		}
		fmt.Fprintln(out, "rma", name, "unknown", "unknown")
		return
	}
	emuRead, emuWrite, err := d.ProbeEFAEmulated()
	fmt.Fprintln(out, "ok", call)
	if err != nil {
		fmt.Fprintln(out, "error", call+":", err)
		return
	}
	fmt.Fprintln(out, "rma", name, yesNo(!emuRead), yesNo(!emuWrite))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// probeResult is what a probe child reported.
type probeResult struct {
	Aborted bool
	Call    string // the call in progress when the child aborted
	Message string // the last line the child wrote on stderr: libfabric's reason
	Err     error  // the child could not run, or ended without an answer
	Domains []string
	RMA     map[string]DeviceRMA // per efa RDM domain whose endpoint opened
}

// runProbe starts this binary again as a probe child with the plan and
// reads what it reports. It never makes the calls itself.
func runProbe(plan probePlan) probeResult {
	exe, err := os.Executable()
	if err != nil {
		return probeResult{Err: fmt.Errorf("EFA probe child: %w", err)}
	}
	return runProbeExe(exe, plan)
}

func runProbeExe(exe string, plan probePlan) probeResult {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), probeChildEnv+"="+plan.encode())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &limitedBuffer{b: &stderr, max: 64 << 10}
	runErr := cmd.Run()
	r := parseProbeOutput(stdout.String())
	r.Message = lastLine(stderr.String())
	var ws syscall.WaitStatus
	if cmd.ProcessState != nil {
		ws, _ = cmd.ProcessState.Sys().(syscall.WaitStatus)
	}
	switch {
	case ws.Signaled() && ws.Signal() == syscall.SIGABRT:
		r.Aborted = true
	case strings.Contains(stderr.String(), "SIGABRT: abort"):
		// Go's own report of an abort() it did not let pass.
		r.Aborted = true
		r.Message = lastLine(stderr.String()[:strings.Index(stderr.String(), "SIGABRT: abort")])
	case runErr != nil:
		r.Err = fmt.Errorf("EFA probe child (%s): %w%s", exe, runErr, stderrNote(r.Message))
	case !strings.Contains(stdout.String(), "\ndone\n") && !strings.HasPrefix(stdout.String(), "done\n"):
		r.Err = fmt.Errorf("EFA probe child (%s) ended without its report%s", exe, stderrNote(r.Message))
	}
	if !r.Aborted {
		r.Call = ""
	}
	return r
}

func stderrNote(msg string) string {
	if msg == "" {
		return ""
	}
	return " (stderr: " + msg + ")"
}

// parseProbeOutput reads a probe child's report; Call is the last call
// that started and did not finish.
func parseProbeOutput(s string) probeResult {
	r := probeResult{RMA: map[string]DeviceRMA{}}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		word, rest, _ := strings.Cut(sc.Text(), " ")
		switch word {
		case "call":
			r.Call = rest
		case "ok":
			if rest == r.Call {
				r.Call = ""
			}
		case "domain":
			r.Domains = append(r.Domains, rest)
		case "rma":
			f := strings.Fields(rest)
			if len(f) == 3 {
				r.RMA[f[0]] = DeviceRMA{Read: tristate(f[1]), Write: tristate(f[2])}
			}
		}
	}
	return r
}

func tristate(s string) Tristate {
	switch s {
	case "yes":
		return Yes
	case "no":
		return No
	}
	return Unknown
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// limitedBuffer keeps the last max bytes written: libfabric's reason is
// the last thing a child prints, and FI_LOG_LEVEL can make it print a lot.
type limitedBuffer struct {
	b   *bytes.Buffer
	max int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	n := len(p)
	l.b.Write(p)
	if over := l.b.Len() - l.max; over > 0 {
		l.b.Next(over)
	}
	return n, nil
}
