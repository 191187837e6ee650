package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/perftest"
)

// serveOptions are serve's flags.
type serveOptions struct {
	manager     managerFlags
	listen      string
	size        string
	once        bool
	idle        time.Duration
	hello       time.Duration
	maxSessions int
	maxMemory   string
	token       string
	asJSON      bool
}

// serveFlags is serve's flag set and the options it fills.
func serveFlags() (*flag.FlagSet, *serveOptions) {
	fs := flag.NewFlagSet("fitransfer serve", flag.ContinueOnError)
	o := &serveOptions{}
	// A server that spins takes a core from clients on the same host, and
	// needs not: shm's single-copy ops do not involve it, and tcp wakes
	// its fi_cq_sread on traffic.
	o.manager.register(fs, "adaptive")
	fs.StringVar(&o.listen, "listen", net.JoinHostPort("", strconv.Itoa(bootstrap.DefaultPort)), "bootstrap TCP address (host:port; port 0 picks one)")
	fs.StringVar(&o.size, "size", "64m", "bytes of each session's buffer (largest transfer; pingpong needs twice its size)")
	fs.BoolVar(&o.once, "once", false, "serve one client, then exit")
	fs.DurationVar(&o.idle, "idle-timeout", 10*time.Minute, "end a session after this long without a message from its client")
	fs.DurationVar(&o.hello, "hello-timeout", perftest.DefaultHelloTimeout, "drop a client that has not said hello (or answered the challenge) within this long")
	fs.IntVar(&o.maxSessions, "max-sessions", perftest.DefaultMaxSessions, "sessions at once; a client beyond is told the server is busy (0: no limit)")
	fs.StringVar(&o.maxMemory, "max-memory", "1g", "bytes of all session buffers at once; a client beyond is told the server is busy (0: no limit)")
	fs.StringVar(&o.token, "token", "", "shared secret clients must prove they hold (default $FITRANSFER_TOKEN); without it, any client is served")
	fs.BoolVar(&o.asJSON, "json", false, "print the listening address and handle as JSON")
	fs.Usage = defaultUsage(fs, "[flags]")
	return fs, o
}

func runServe(args []string, stdout, stderr io.Writer) int {
	fs, o := serveFlags()
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	mf := &o.manager
	size, err := perftest.ParseSize(o.size)
	if err != nil {
		return fail(stderr, "serve", usageError{fmt.Errorf("--size: %w", err)})
	}
	for flag, d := range map[string]time.Duration{"--idle-timeout": o.idle, "--hello-timeout": o.hello} {
		if d <= 0 {
			return fail(stderr, "serve", usageError{fmt.Errorf("%s %v: want a positive duration", flag, d)})
		}
	}
	maxMem, err := parseMaxMemory(o.maxMemory)
	if err != nil {
		return fail(stderr, "serve", usageError{fmt.Errorf("--max-memory: %w", err)})
	}
	if o.token == "" {
		o.token = os.Getenv(tokenEnv)
	}
	derived := false
	if mf.source == "" {
		// Data follows control: a server told to listen on one address
		// sends its RMA traffic through that address's interface too.
		if host, _, err := net.SplitHostPort(o.listen); err == nil && !wildcardHost(host) {
			mf.source, derived = host, true
		}
	}
	ctx, stop := interruptible()
	defer stop()
	m, err := mf.open(ctx)
	if err != nil && derived {
		// tcp cannot bind the listen address (not an address of this
		// host's tcp, say): serve with what the machine has, and say so.
		fmt.Fprintf(stderr, "fitransfer serve: opening the endpoints with tcp bound to %s failed (%v); serving without tcp bound there\n", mf.source, oneLine(err))
		mf.source = ""
		m, err = mf.open(ctx)
	}
	if err != nil {
		return fail(stderr, "serve", err)
	}
	defer m.Close()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "fitransfer serve: "+format+"\n", a...) }
	infof := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	srv, err := perftest.Listen(m, o.listen, perftest.ServerConfig{Size: size, Idle: o.idle, Hello: o.hello,
		MaxSessions: o.maxSessions, MaxMemory: maxMem, Token: o.token}, logf, infof)
	if err != nil {
		return fail(stderr, "serve", err)
	}
	defer srv.Close()
	h, err := srv.Handle().MarshalBinary()
	if err != nil {
		return fail(stderr, "serve", err)
	}
	var backends []string
	for _, b := range m.Backends() {
		if b.Role != "outgoing" && b.Role != "retired" { // what clients reach
			backends = append(backends, b.Provider)
		}
	}
	if o.asJSON {
		_ = writeJSON(stdout, map[string]any{"listen": srv.Addr().String(), "handle": h, "size": size, "backends": backends})
	} else {
		fmt.Fprintf(stdout, "listening on %s (%d-byte buffers over %v)\n", srv.Addr(), size, backends)
		fmt.Fprintf(stdout, "handle: %s\n", base64.StdEncoding.EncodeToString(h))
	}
	if f, ok := stdout.(interface{ Sync() error }); ok {
		_ = f.Sync()
	}
	if err := srv.Serve(ctx, o.once); err != nil && ctx.Err() == nil {
		return fail(stderr, "serve", err)
	}
	return exitOK
}

// tokenEnv names the variable that holds the shared secret of serve and
// its clients when --token is not given.
const tokenEnv = "FITRANSFER_TOKEN"

// wildcardHost reports whether a listen host means every interface.
func wildcardHost(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// parseMaxMemory reads --max-memory: a size, or 0 for no limit.
func parseMaxMemory(s string) (uint64, error) {
	if strings.TrimSpace(s) == "0" {
		return 0, nil
	}
	return perftest.ParseSize(s)
}
