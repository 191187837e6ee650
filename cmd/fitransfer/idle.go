package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/fitransfer/fitransfer/bootstrap"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/perftest"
	"github.com/fitransfer/fitransfer/transport"
)

// idleFigures are what idleness costs: the CPU a manager with default
// options uses while it has nothing to do, and how long a peer's first 8 B
// read takes after both sides idled, per route (the owner, a local
// `serve`, may have to progress its endpoint for it: tcp;ofi_rxm, and shm
// for a new peer or without CMA).
type idleFigures struct {
	span    time.Duration
	cpu     float64 // % of a core
	cpuErr  error
	firstOp []firstOp
}

// firstOp is the first read over one route after an idle spell.
type firstOp struct {
	provider string
	took     time.Duration
	err      error
}

// measureIdle measures the idle figures, each over span: the CPU of a
// default manager in this process (nothing else runs here meanwhile), then
// the first read over each of provs, all of whose sessions idled together.
func measureIdle(ctx context.Context, provs []string, span, timeout time.Duration, stderr io.Writer) idleFigures {
	f := idleFigures{span: span}
	f.cpu, f.cpuErr = idleCPU(ctx, span)
	type session struct {
		provider string
		m        *transport.Manager
		s        *perftest.Session
		mem      []byte
		dst      *transport.Buffer
		src      transport.RemoteBuffer
		err      error
	}
	var sessions []*session
	var servers []func()
	defer func() {
		for _, s := range sessions {
			if s.s != nil {
				s.s.Close()
			}
			if s.dst != nil {
				_ = s.dst.Close()
			}
			if s.m != nil {
				_ = s.m.Close()
			}
			if s.mem != nil {
				_ = mr.Free(s.mem)
			}
		}
		for _, stop := range servers {
			stop()
		}
	}()
	for _, prov := range provs {
		s := &session{provider: prov}
		sessions = append(sessions, s)
		addr, stop, err := startLocalServer(prov, 4096, stderr)
		if err != nil {
			s.err = err
			continue
		}
		servers = append(servers, stop)
		if s.m, s.err = (&managerFlags{providers: prov, poll: "adaptive", timeout: timeout}).open(ctx); s.err != nil {
			continue
		}
		if s.s, s.err = perftest.Connect(perftest.Config{Server: addr, Manager: s.m, Mode: bootstrap.ModeRead,
			Timeout: timeout, Token: os.Getenv(tokenEnv)}, bootstrap.Message{}); s.err != nil {
			continue
		}
		if s.mem, s.err = mr.Alloc(8); s.err != nil {
			continue
		}
		if s.dst, s.err = s.m.Register(s.mem, 0); s.err != nil {
			continue
		}
		if s.src, s.err = s.s.Remote().Slice(0, 8); s.err != nil {
			continue
		}
		// The first read ever sets up what later ones reuse (address
		// exchange, connection, verification): not what is measured.
		s.err = s.m.ReadInto(ctx, s.dst, s.src)
	}
	if !sleepCtx(ctx, span) {
		for _, s := range sessions {
			f.firstOp = append(f.firstOp, firstOp{provider: s.provider, err: ctx.Err()})
		}
		return f
	}
	for _, s := range sessions {
		op := firstOp{provider: s.provider, err: s.err}
		if op.err == nil {
			start := time.Now()
			op.err = s.m.ReadInto(ctx, s.dst, s.src)
			op.took = time.Since(start)
		}
		f.firstOp = append(f.firstOp, op)
	}
	return f
}

// idleCPU is the CPU a manager with default options takes over span doing
// nothing, in % of a core, from this process's utime and stime.
func idleCPU(ctx context.Context, span time.Duration) (float64, error) {
	m, err := transport.New(ctx, transport.WithLogger(logger()))
	if err != nil {
		return 0, err
	}
	defer m.Close()
	runtime.GC() // the sweep's garbage is not the manager's
	before, err := processCPU()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if !sleepCtx(ctx, span) {
		return 0, ctx.Err()
	}
	after, err := processCPU()
	if err != nil {
		return 0, err
	}
	return 100 * float64(after-before) / float64(time.Since(start)), nil
}

// clockTick is the unit of /proc/PID/stat's times (USER_HZ, 100 on
// Linux).
const clockTick = 10 * time.Millisecond

// processCPU is the user and system time this process has used, from
// /proc/self/stat.
func processCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) out of a
// /proc/PID/stat line; the command name, field 2, may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("/proc/self/stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	if len(f) < 13 {
		return 0, errors.New("/proc/self/stat: too few fields")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/self/stat: utime %q, stime %q", f[11], f[12])
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// print writes the figures as two lines after the table, each behind
// prefix ("# " under CSV, for readers that skip comments). It returns the
// first measurement that failed.
func (f idleFigures) print(w io.Writer, prefix string) error {
	var first error
	note := func(err error) string {
		if first == nil {
			first = err
		}
		return "(failed: " + oneLine(err) + ")"
	}
	cpu := f2(f.cpu) + "% of a core"
	if f.cpuErr != nil {
		cpu = note(f.cpuErr)
	}
	fmt.Fprintf(w, "%sidle: a manager with default options used %s over %v (utime+stime, /proc/self/stat)\n", prefix, cpu, f.span)
	var ops []string
	for _, op := range f.firstOp {
		v := f2(float64(op.took)/float64(time.Microsecond)) + " usec"
		if op.err != nil {
			v = note(op.err)
		}
		ops = append(ops, op.provider+" "+v)
	}
	fmt.Fprintf(w, "%sfirst 8 B read after %v idle, owner a local serve: %s\n", prefix, f.span, strings.Join(ops, ", "))
	return first
}
