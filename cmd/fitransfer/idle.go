package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// firstOp is the first read over one route after each of
// firstOpRounds idle spells.
type firstOp struct {
	provider string
	took     []time.Duration
	err      error
}

// firstOpRounds is how many idle spells, of span/firstOpRounds each, the
// first reads follow: one read says little on a busy machine, whose
// scheduler alone can delay a wake-up by milliseconds.
const firstOpRounds = 5

// measureIdle measures the idle figures, each over span: the CPU of a
// default manager in this process (nothing else runs here meanwhile), then
// the first read over each of provs after each of firstOpRounds idle
// spells. The routes' reads are staggered, a spell over len(provs) apart:
// each follows its own route's previous read by a spell, and no read
// follows another route's while that route's loops still spin after it
// (on a 2-core machine a tcp read right after an shm one waited
// milliseconds for the CPU).
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
	// Several servers run at once, each copying its stderr into this one
	// writer from a goroutine of its own.
	stderr = &lockedWriter{w: stderr}
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
	ops := make([]firstOp, len(sessions))
	for i, s := range sessions {
		ops[i] = firstOp{provider: s.provider, err: s.err}
	}
	f.firstOp = ops
	for round := 0; round < firstOpRounds; round++ {
		for i, s := range sessions {
			if !sleepCtx(ctx, f.spell()/time.Duration(len(sessions))) {
				for i := range ops {
					ops[i].err = ctx.Err()
				}
				return f
			}
			if ops[i].err != nil {
				continue
			}
			start := time.Now()
			ops[i].err = s.m.ReadInto(ctx, s.dst, s.src)
			ops[i].took = append(ops[i].took, time.Since(start))
		}
	}
	return f
}

// spell is the idle spell before each first read: since the previous
// read over the same route.
func (f idleFigures) spell() time.Duration { return max(f.span/firstOpRounds, time.Millisecond) }

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
		if op.err != nil {
			ops = append(ops, op.provider+" "+note(op.err))
			continue
		}
		us := make([]float64, len(op.took))
		for i, d := range op.took {
			us[i] = float64(d) / float64(time.Microsecond)
		}
		ops = append(ops, op.provider+" "+f2(median(us))+" usec (max "+f2(slices.Max(us))+")")
	}
	fmt.Fprintf(w, "%sfirst 8 B read after %v idle, median of %d (owner a local serve): %s\n",
		prefix, f.spell(), firstOpRounds, strings.Join(ops, ", "))
	return first
}

// sleepCtx sleeps for d, or less when ctx ends: false then.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
