// Command fitransfer moves bytes between registered memory of two
// processes with libfabric RMA, and tells what this machine's fabric can
// do.
//
//	fitransfer info [fi_info flags] [--json]   what the providers offer
//	fitransfer doctor [--json]                 can a transfer work here, and why not
//	fitransfer serve [--listen HOST:PORT]      answer clients with a registered buffer
//	fitransfer read|write|pingpong HOST[:PORT] measure against a server, as fabtests do
//	fitransfer bench                           local server and client, every provider
//	fitransfer hint [-p efa] CODE              what an error number means, and its fix
//
// Run `fitransfer help` for every command.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/internal/doctor"
	"github.com/fitransfer/fitransfer/internal/floor"
)

// exit statuses shared by every command.
const (
	exitOK    = 0
	exitFail  = 1 // the command ran and failed (no provider, transfer error)
	exitUsage = 2 // bad flags or arguments
)

type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
	// flags builds the command's flag set without running it (the
	// README's synopsis is tested against it).
	flags func() *flag.FlagSet
}

func commands() []command {
	return []command{
		{"info", "list what libfabric's providers offer, as fi_info does (--json for all of it)", runInfo, flagSet(infoFlags)},
		{"doctor", "check that transfers can work on this machine, with a fix for each problem", runDoctor, flagSet(doctorFlags)},
		{"serve", "register a buffer and answer clients (read, write, pingpong) until interrupted", runServe, flagSet(serveFlags)},
		{"read", "measure RMA reads from a server: fabtests' columns, -S -I -w -W -v", runRead, testFlagsOf("read", bootstrap.ModeRead)},
		{"write", "measure RMA writes to a server (delivery complete unless --transmit-complete)", runWrite, testFlagsOf("write", bootstrap.ModeWrite)},
		{"pingpong", "measure RMA write ping-pong latency with a server (as ib_write_lat)", runPingPong, testFlagsOf("pingpong", bootstrap.ModePingPong)},
		{"bench", "local server and client over every usable provider, one table (--compare: next to the peer tools)", runBench, flagSet(benchFlags)},
		{"hint", "explain an error number (an efa prov_errno with -p efa, or an fi_errno) and its fix", runHint, flagSet(hintFlags)},
	}
}

// flagSet keeps the flag set of a command's flag constructor.
func flagSet[T any](build func() (*flag.FlagSet, T)) func() *flag.FlagSet {
	return func() *flag.FlagSet {
		fs, _ := build()
		return fs
	}
}

// testFlagsOf is the flag constructor of read, write or pingpong.
func testFlagsOf(name, mode string) func() *flag.FlagSet {
	return flagSet(func() (*flag.FlagSet, *testFlags) { return testFlagSet(name, mode) })
}

// maybeRunChild runs this process as the child another fitransfer
// process started, and reports whether it did and its exit status:
// doctor's CMA probe target, or bench's floor peer (internal/floor).
func maybeRunChild() (bool, int) {
	if handled, code := doctor.MaybeRunCMAChild(); handled {
		return true, code
	}
	handled, err := floor.ServePeer()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fitransfer (bench's floor peer):", err)
		return true, exitFail
	}
	return handled, exitOK
}

func main() {
	if handled, code := maybeRunChild(); handled {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	case "version", "--version":
		return runInfo([]string{"--version"}, stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "fitransfer: unknown command %q; commands: %s\n", args[0], commandNames())
	return exitUsage
}

func commandNames() string {
	s := ""
	for i, c := range commands() {
		if i > 0 {
			s += ", "
		}
		s += c.name
	}
	return s
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fitransfer COMMAND [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "`fitransfer COMMAND -h` lists a command's flags.")
}

// parseFlags parses a command's flags and refuses positional arguments.
// On -h it prints the full usage to stdout; on a bad flag it prints one
// line naming it. ok is false when the command must return code.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	pos, code, ok := parseArgs(fs, args, stdout, stderr)
	if ok && len(pos) > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see `%s -h`)\n", fs.Name(), pos[0], fs.Name())
		return exitUsage, false
	}
	return code, ok
}

// parseArgs parses flags that may stand before and after the positional
// arguments ("read HOST -S 1m" as well as "read -S 1m HOST") and returns
// the positionals.
func parseArgs(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (pos []string, code int, ok bool) {
	var msg bytes.Buffer
	fs.SetOutput(&msg)
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	for {
		err := fs.Parse(args)
		switch {
		case errors.Is(err, flag.ErrHelp):
			fs.SetOutput(stdout)
			usage()
			return nil, exitOK, false
		case err != nil:
			fmt.Fprintf(stderr, "%s: %v (see `%s -h`)\n", fs.Name(), err, fs.Name())
			return nil, exitUsage, false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// defaultUsage prints "usage: NAME ARGS" and the flag defaults to the flag
// set's output.
func defaultUsage(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		fmt.Fprintf(fs.Output(), "usage: %s %s\n", fs.Name(), strings.TrimSpace(synopsis))
		fs.PrintDefaults()
	}
}
