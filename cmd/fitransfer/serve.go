package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/perftest"
)

func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fitransfer serve", flag.ContinueOnError)
	var mf managerFlags
	// A server that spins takes a core from clients on the same host, and
	// needs not: shm's single-copy ops do not involve it, and tcp wakes
	// its fi_cq_sread on traffic.
	mf.register(fs, "adaptive")
	listen := fs.String("listen", net.JoinHostPort("", strconv.Itoa(bootstrap.DefaultPort)), "bootstrap TCP address (host:port; port 0 picks one)")
	sizeStr := fs.String("size", "64m", "bytes of each session's buffer (largest transfer; pingpong needs twice its size)")
	once := fs.Bool("once", false, "serve one client, then exit")
	idle := fs.Duration("idle-timeout", 10*time.Minute, "end a session after this long without a message from its client")
	hello := fs.Duration("hello-timeout", perftest.DefaultHelloTimeout, "drop a client that has not said hello (or answered the challenge) within this long")
	maxSessions := fs.Int("max-sessions", perftest.DefaultMaxSessions, "sessions at once; a client beyond is told the server is busy (0: no limit)")
	maxMemStr := fs.String("max-memory", "1g", "bytes of all session buffers at once; a client beyond is told the server is busy (0: no limit)")
	token := fs.String("token", "", "shared secret clients must prove they hold (default $FITRANSFER_TOKEN); without it, any client is served")
	asJSON := fs.Bool("json", false, "print the listening address and handle as JSON")
	fs.Usage = defaultUsage(fs, "[flags]")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	size, err := perftest.ParseSize(*sizeStr)
	if err != nil {
		return fail(stderr, "serve", usageError{fmt.Errorf("--size: %w", err)})
	}
	maxMem, err := perftest.ParseSize(*maxMemStr)
	if err != nil {
		return fail(stderr, "serve", usageError{fmt.Errorf("--max-memory: %w", err)})
	}
	if *token == "" {
		*token = os.Getenv(tokenEnv)
	}
	derived := false
	if mf.source == "" {
		// Data follows control: a server told to listen on one address
		// sends its RMA traffic through that address's interface too.
		if host, _, err := net.SplitHostPort(*listen); err == nil && !wildcardHost(host) {
			mf.source, derived = host, true
		}
	}
	ctx, stop := interruptible()
	defer stop()
	m, err := mf.open(ctx)
	if err != nil && derived {
		// No tcp endpoint on the listen address (FI_PROVIDER leaves tcp
		// out, say): serve with what the machine has, and say so.
		fmt.Fprintf(stderr, "fitransfer serve: no tcp endpoint on %s (%v); serving without one bound there\n", mf.source, oneLine(err))
		mf.source = ""
		m, err = mf.open(ctx)
	}
	if err != nil {
		return fail(stderr, "serve", err)
	}
	defer m.Close()
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "fitransfer serve: "+format+"\n", a...) }
	infof := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	srv, err := perftest.Listen(m, *listen, perftest.ServerConfig{Size: size, Idle: *idle, Hello: *hello,
		MaxSessions: *maxSessions, MaxMemory: maxMem, Token: *token}, logf, infof)
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
		backends = append(backends, b.Provider)
	}
	if *asJSON {
		_ = writeJSON(stdout, map[string]any{"listen": srv.Addr().String(), "handle": h, "size": size, "backends": backends})
	} else {
		fmt.Fprintf(stdout, "listening on %s (%d-byte buffers over %v)\n", srv.Addr(), size, backends)
		fmt.Fprintf(stdout, "handle: %s\n", base64.StdEncoding.EncodeToString(h))
	}
	if f, ok := stdout.(interface{ Sync() error }); ok {
		_ = f.Sync()
	}
	if err := srv.Serve(ctx, *once); err != nil && ctx.Err() == nil {
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
