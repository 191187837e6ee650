package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/progress"
	"github.com/fitransfer/fitransfer/transport"
)

// exitInterrupted is the status after Ctrl-C (128 + SIGINT).
const exitInterrupted = 130

// managerFlags are the flags every command that opens endpoints takes.
type managerFlags struct {
	providers        string
	source           string
	poll             string
	transmitComplete bool
	timeout          time.Duration
}

func (f *managerFlags) register(fs *flag.FlagSet, defaultPoll string) {
	fs.StringVar(&f.providers, "p", "", "provider(s), comma-separated: shm, tcp (tcp;ofi_rxm), efa (default: fitransfer's choice)")
	fs.StringVar(&f.source, "s", "", "local address for tcp (source address)")
	fs.StringVar(&f.poll, "poll", defaultPoll, "progress loops: busy (always spin, as fabtests) or adaptive (spin after activity, then sleep or block in fi_cq_sread)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "deadline of each transfer and bootstrap exchange")
}

// open creates the manager the flags describe.
func (f *managerFlags) open(ctx context.Context) (*transport.Manager, error) {
	if f.timeout <= 0 {
		return nil, usageError{fmt.Errorf("--timeout %v: want a positive duration", f.timeout)}
	}
	opts := []transport.Option{transport.WithTimeout(f.timeout), transport.WithLogger(logger())}
	switch f.poll {
	case "busy":
		opts = append(opts, transport.WithPollPolicy(progress.BusyPollPolicy))
	case "adaptive":
	default:
		return nil, usageError{fmt.Errorf("--poll %q: want busy or adaptive", f.poll)}
	}
	if f.providers != "" {
		opts = append(opts, transport.WithProviders(strings.Split(f.providers, ",")...))
	}
	if f.source != "" {
		opts = append(opts, transport.WithSourceAddress(f.source))
	}
	if f.transmitComplete {
		opts = append(opts, transport.WithTransmitComplete())
	}
	m, err := transport.New(ctx, opts...)
	if err != nil && !strings.Contains(err.Error(), "fitransfer doctor") {
		return nil, fmt.Errorf("%w (see `fitransfer doctor`)", err)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// usageError is bad input: exit status 2.
type usageError struct{ error }

// logger is quiet unless FITRANSFER_LOG names a level (debug, info, warn).
func logger() zerolog.Logger {
	lvl, err := zerolog.ParseLevel(os.Getenv("FITRANSFER_LOG"))
	if err != nil || os.Getenv("FITRANSFER_LOG") == "" {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(lvl).With().Timestamp().Logger()
}

// hostPort adds the default port to HOST.
func hostPort(s string) string {
	if _, _, err := net.SplitHostPort(s); err == nil {
		return s
	}
	return net.JoinHostPort(strings.Trim(s, "[]"), strconv.Itoa(bootstrap.DefaultPort))
}

// interruptible returns a context that ends on Ctrl-C or SIGTERM.
func interruptible() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// fail prints one line and returns the exit status for err.
func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "fitransfer %s: %s\n", cmd, oneLine(err))
	var ue usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	if errors.Is(err, context.Canceled) {
		return exitInterrupted
	}
	return exitFail
}

// oneLine flattens an error message to one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", " ")), " ")
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
