package main

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/internal/testenv"
	"github.com/fitransfer/fitransfer/perftest"
)

func TestAggregatePairsEachRunWithThePeerRunAfterIt(t *testing.T) {
	row := func(mbps float64) perftest.Row {
		return perftest.Row{Op: "write", Provider: "shm", Bytes: 8, Iters: 100, Window: 64, MBps: mbps}
	}
	peer := func(mbps float64) peerResult { return peerResult{tool: "fi_rma_bw", mbps: mbps, usec: 8 / mbps} }
	tests := []struct {
		name                  string
		ours                  []float64
		theirs                []peerResult
		mbps, min, max        float64
		peerMBps              float64
		ratio, ratioMin, rMax float64
		peerErr               string
	}{
		{
			// The machine slows down 4× over the repeats: each side
			// spreads 4×, every pair says 0.5.
			name: "drift", ours: []float64{1, 2, 4}, theirs: []peerResult{peer(2), peer(4), peer(8)},
			mbps: 2, min: 1, max: 4, peerMBps: 4, ratio: 0.5, ratioMin: 0.5, rMax: 0.5,
		},
		{
			// The medians alone (2 and 2) would say 1; the pairs say
			// 3, 0.5 and 0.5.
			name: "spread", ours: []float64{3, 1, 2}, theirs: []peerResult{peer(1), peer(2), peer(4)},
			mbps: 2, min: 1, max: 3, peerMBps: 2, ratio: 0.5, ratioMin: 0.5, rMax: 3,
		},
		{
			// With an even count, the lower of the two middle runs.
			name: "even", ours: []float64{4, 2}, theirs: []peerResult{peer(1), peer(1)},
			mbps: 2, min: 2, max: 4, peerMBps: 1, ratio: 2, ratioMin: 2, rMax: 4,
		},
		{
			name: "peer failed", ours: []float64{1, 1}, theirs: []peerResult{peer(1), {tool: "fi_rma_bw", err: errors.New("fi_rma_bw: exit status 1")}},
			mbps: 1, min: 1, max: 1, peerErr: "fi_rma_bw: exit status 1",
		},
		{name: "no peer tool", ours: []float64{1}, theirs: []peerResult{{}}, mbps: 1, min: 1, max: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ours [][]perftest.Row
			var theirs [][]peerResult
			for i, v := range tt.ours {
				ours = append(ours, []perftest.Row{row(v)})
				theirs = append(theirs, []peerResult{tt.theirs[i]})
			}
			rows := aggregate(ours, theirs)
			require.Len(t, rows, 1)
			r := rows[0]
			assert.Equal(t, len(tt.ours), r.Repeats)
			assert.Equal(t, tt.mbps, r.MBps)
			assert.Equal(t, tt.min, r.MBpsMin)
			assert.Equal(t, tt.max, r.MBpsMax)
			assert.Equal(t, tt.peerErr, r.PeerError)
			assert.Equal(t, tt.peerMBps, r.PeerMBps)
			assert.InDelta(t, tt.ratio, r.Ratio, 1e-9)
			assert.InDelta(t, tt.ratioMin, r.RatioMin, 1e-9)
			assert.InDelta(t, tt.rMax, r.RatioMax, 1e-9)
		})
	}
}

// fakeRMABW stands in for fabtests' fi_rma_bw, which is not built here:
// as client it logs its run to $FAKE_LOG and prints fabtests' result line
// with MB/sec = $FAKE_MBPS, and it fails when a `serve` started by the
// bench (a child of the test process, as the stand-in is) still runs. As
// server it exits once its client has, as fabtests' servers do.
const fakeRMABW = `#!/bin/bash
last="${@: -1}"; prev="${@: -2:1}"
if [ "$prev" = "-s" ]; then
  until [ -e "$FAKE_LOG.client" ]; do sleep 0.01; done
  rm -f "$FAKE_LOG.client"; exit 0
fi
for p in /proc/[0-9]*; do
  if [ "$(cut -d' ' -f4 $p/stat 2>/dev/null)" = "$PPID" ] && tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q ' serve '; then
    echo "a bench server is running: $(tr '\0' ' ' < $p/cmdline)" >&2; exit 1
  fi
done
echo "peer" >> "$FAKE_LOG"
echo "bytes   iters   total       time     MB/sec    usec/xfer   Mxfers/sec"
echo "8       200     1.6k        0.00s    $FAKE_MBPS       4.00        0.25"
touch "$FAKE_LOG.client"
`

// TestBenchComparesWithThePeerTool runs `bench --compare --repeat 2` over
// shm: real servers and transfers of ours, and a stand-in fi_rma_bw.
func TestBenchComparesWithThePeerTool(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fi_rma_bw"), []byte(fakeRMABW), 0o755))
	log := filepath.Join(dir, "log")
	t.Setenv("FAKE_LOG", log)
	t.Setenv("FAKE_MBPS", "0.50")
	t.Setenv(asCLI, "1") // the bench's `serve` children are this test binary
	out, errOut, code := runCLI("bench", "--providers", "shm", "--ops", "write", "-S", "8", "-I", "200",
		"--compare", "--repeat", "2", "--csv", "--fabtests", dir, "--timeout", "30s", "--idle", "0")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, out)
	require.Len(t, recs, 2, out)
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	for _, h := range []string{"MB/sec min", "MB/sec max", "peer tool", "peer MB/sec", "ratio", "ratio min", "ratio max"} {
		require.Contains(t, col, h)
	}
	num := func(rec []string, h string) float64 {
		v, err := strconv.ParseFloat(rec[col[h]], 64)
		require.NoError(t, err, "%s in %v", h, rec)
		return v
	}
	write := recs[1]
	assert.Equal(t, "write", write[col["test"]])
	assert.Equal(t, "fi_rma_bw -U -j 0", write[col["peer tool"]])
	require.NotContains(t, write[col["peer MB/sec"]], "(", "the stand-in failed")
	assert.Equal(t, 0.5, num(write, "peer MB/sec"))
	mb := num(write, "MB/sec")
	assert.Equal(t, 200.0, num(write, "iters"), "every iteration ran") // a figure, not a speed: 8 B writes can print 0.00 MB/sec on a busy machine
	assert.LessOrEqual(t, num(write, "MB/sec min"), mb)
	assert.GreaterOrEqual(t, num(write, "MB/sec max"), mb)
	assert.InDelta(t, mb/0.5, num(write, "ratio"), 0.02)
	assert.LessOrEqual(t, num(write, "ratio min"), num(write, "ratio"))
	assert.GreaterOrEqual(t, num(write, "ratio max"), num(write, "ratio"))
	calls, err := os.ReadFile(log)
	require.NoError(t, err)
	assert.Equal(t, "peer\npeer\n", string(calls), "one peer run per repeat")
}

// TestBenchPingPongNextToFiPingpong runs the pingpong row next to the
// real fi_pingpong (libfabric-bin) and to the raw-endpoint floor under it
// (internal/floor, this test binary as its peer).
func TestBenchPingPongNextToFiPingpong(t *testing.T) {
	t.Setenv(asCLI, "1")
	t.Setenv("FABTESTS_BIN", "")
	out, errOut, code := runCLI("bench", "--providers", "shm", "--ops", "pingpong", "-S", "8", "-I", "200",
		"--compare", "--timeout", "30s", "--idle", "0")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	for i, peer := range [][]string{{"fi_pingpong"}, {"raw", "floor", "(internal/floor)"}} {
		line := lines[1+i]
		f := strings.Fields(line)
		require.Len(t, f, 13+len(peer), "a row with the peer's figures and a ratio: %q", line)
		assert.Equal(t, []string{"shm", "pingpong", "8"}, f[:3])
		assert.Equal(t, peer, f[10:10+len(peer)])
		var x [4]float64
		for i, v := range []string{f[5], f[len(f)-3], f[len(f)-1], f[len(f)-2]} { // MB/sec, peer MB/sec, ratio, peer usec/xfer
			var err error
			x[i], err = strconv.ParseFloat(v, 64)
			require.NoError(t, err, line)
		}
		assert.Equal(t, "200", f[3], "every iteration ran")
		assert.Greater(t, x[3], 0.0, "the peer's figure: %s", line)
		// The ratio is ours over the peer's (MB/sec), within what printing
		// both to 0.01 leaves of them: a busy machine can print 0.01 or
		// 0.00 for 8 B, which is a figure, not a failure.
		lo, hi := (x[0]-0.005)/(x[1]+0.005), math.Inf(1)
		if x[1] > 0.005 {
			hi = (x[0] + 0.005) / (x[1] - 0.005)
		}
		assert.True(t, x[2] >= lo-0.005 && x[2] <= hi+0.005, "ratio %v outside [%v, %v]: %s", x[2], lo, hi, line)
	}
}

// TestFloorRows: the rows compared with the raw-endpoint floor are the 8 B
// window-1 reads and writes and the 8 B pingpongs over shm and tcp.
func TestFloorRows(t *testing.T) {
	p := &peerTools{}
	row := func(op, prov string, size uint64, window int) perftest.Row {
		return perftest.Row{Op: op, Provider: prov, Bytes: size, Window: window, Iters: 100}
	}
	for _, tc := range []struct {
		r    perftest.Row
		want bool
	}{
		{row("write", "shm", 8, 1), true},
		{row("read", "tcp;ofi_rxm", 8, 1), true},
		{row("pingpong", "shm", 8, 1), true},
		{row("pingpong", "tcp;ofi_rxm", 8, 1), true},
		{row("write", "shm", 8, 64), false},
		{row("read", "shm", 4096, 1), false},
		{row("pingpong", "mem", 8, 1), false},
		{row("write", "cma", 8, 1), false},
		{row("read", "efa", 8, 1), false},
	} {
		assert.Equal(t, tc.want, p.hasFloor(tc.r), "%s %s %d W%d", tc.r.Op, tc.r.Provider, tc.r.Bytes, tc.r.Window)
	}
}

// TestFloorFlags: the floor's writes ask for what fitransfer's ask for
// (libfabric.Route.Completion and WriteFlags): over tcp a pingpong's only
// that the source may be reused, the others delivery complete; over shm
// on libfabric 1.x, whose initiator copies where CMA reaches the owner,
// transmit complete; over shm on 2.x delivery complete, and on 2.0 to 2.6
// a pingpong's 8 B (which shm carries inside its command) only that the
// source may be reused.
func TestFloorFlags(t *testing.T) {
	row := func(op, prov string) perftest.Row {
		return perftest.Row{Op: op, Provider: prov, Bytes: 8, Window: 1, Iters: 100}
	}
	t.Run("tcp", func(t *testing.T) {
		assert.Equal(t, fabric.OpInjectComplete, floorFlags(row("pingpong", "tcp;ofi_rxm")))
		assert.Equal(t, fabric.OpDeliveryComplete, floorFlags(row("write", "tcp;ofi_rxm")))
	})
	t.Run("shm", func(t *testing.T) {
		// 1.x: shm's single copy, complete once copied (where CMA works);
		// 2.x: the owner copies, and on 2.0 to 2.6 an 8 B pingpong write
		// completes once posted.
		write, pingpong := fabric.OpDeliveryComplete, fabric.OpDeliveryComplete
		if v := fabric.RuntimeVersion(); v.Major() == 2 && v.Minor() <= 6 {
			pingpong = fabric.OpInjectComplete
		}
		if fabric.RuntimeVersion().Major() == 1 {
			testenv.RequireCMA(t)
			if fabric.EnvTruthy("FI_SHM_DISABLE_CMA") {
				testenv.Missing(t, "needs shm's CMA: FI_SHM_DISABLE_CMA is set")
			}
			write, pingpong = fabric.OpTransmitComplete, fabric.OpTransmitComplete
		}
		assert.Equal(t, write, floorFlags(row("write", "shm")))
		assert.Equal(t, pingpong, floorFlags(row("pingpong", "shm")))
	})
}

// fakePingpong stands in for fi_pingpong: its server fails to bind its
// control port for the first $FAKE_BUSY runs (as when another connection
// holds it), then listens; its client is refused until a server listens.
const fakePingpong = `#!/bin/bash
d="$FAKE_DIR"
if [[ " $* " == *" -B "* ]]; then
  n=$(( $(cat "$d/servers" 2>/dev/null || echo 0) + 1 )); echo $n > "$d/servers"
  echo "$*" >> "$d/server-args"
  if [ $n -le "$FAKE_BUSY" ]; then echo "bind(): util/pingpong.c:460 , ret=-98 (Address already in use)" >&2; exit 1; fi
  touch "$d/listening"
  until [ -e "$d/client" ]; do sleep 0.01; done
  exit 0
fi
[ -e "$d/listening" ] || exit 111
echo "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec"
echo "8 200 =200 3.1k 0.00s $FAKE_MBPS 1.30 0.77"
touch "$d/client"
`

// TestPeerToolServerThatCannotBind: a peer tool's server that exits before
// its client connects is run again on another port, and after three
// such runs the bench says why, long before the timeout.
func TestPeerToolServerThatCannotBind(t *testing.T) {
	for _, tt := range []struct {
		busy    int
		printed string // MB/sec
		mbps    float64
		servers int
		err     string
	}{
		{busy: 2, printed: "6.15", mbps: 6.15, servers: 3},
		// Two decimals: 8 B in 1.30 usec is 6.15 MB/sec; a slower run
		// prints 0.00, and the rate comes from the size and usec/xfer.
		{busy: 0, printed: "0.00", mbps: 8 / 1.30, servers: 1},
		{busy: 3, printed: "6.15", servers: 3, err: "fi_pingpong: its server exited before the client connected: bind(): util/pingpong.c:460 , ret=-98 (Address already in use)"},
	} {
		t.Run(strconv.Itoa(tt.busy)+"/"+tt.printed, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "fi_pingpong"), []byte(fakePingpong), 0o755))
			t.Setenv("FAKE_DIR", dir)
			t.Setenv("FAKE_BUSY", strconv.Itoa(tt.busy))
			t.Setenv("FAKE_MBPS", tt.printed)
			mbps, usec, err := runPeerTool(context.Background(), filepath.Join(dir, "fi_pingpong"),
				[]string{"-p", "shm", "-e", "rdm"}, time.Minute)
			if tt.err != "" {
				require.EqualError(t, err, tt.err)
			} else {
				require.NoError(t, err)
				assert.InDelta(t, tt.mbps, mbps, 1e-9)
				assert.Equal(t, 1.30, usec)
			}
			n, err := os.ReadFile(filepath.Join(dir, "servers"))
			require.NoError(t, err)
			assert.Equal(t, strconv.Itoa(tt.servers), strings.TrimSpace(string(n)))
			args, err := os.ReadFile(filepath.Join(dir, "server-args"))
			require.NoError(t, err)
			ports := map[string]bool{}
			for _, l := range strings.Split(strings.TrimSpace(string(args)), "\n") {
				f := strings.Fields(l)
				require.Equal(t, "-B", f[len(f)-2], l)
				ports[f[len(f)-1]] = true
			}
			assert.Len(t, ports, tt.servers, "each run on a port of its own: %s", args)
		})
	}
}

// TestBenchPrintsMemcpyNextToMem: a sweep with the mem route ends with a
// memcpy row per size, the bound mem is held against.
func TestBenchPrintsMemcpyNextToMem(t *testing.T) {
	testenv.RequireRoute(t, testenv.RouteMem)
	t.Setenv(asCLI, "1")
	out, errOut, code := runCLI("bench", "--providers", "mem", "--ops", "write", "-S", "8,4096", "-I", "200", "--csv", "--timeout", "30s", "--idle", "0")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	require.NoError(t, err, out)
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	var got []string
	for _, r := range recs[1:] {
		got = append(got, r[col["provider"]]+" "+r[col["test"]]+" "+r[col["bytes"]])
	}
	assert.Equal(t, []string{"mem write 8", "mem write 4k", "memcpy copy 8", "memcpy copy 4k"}, got, out)
}

// TestBenchIdleFigures: after the table, bench prints the idle CPU of a
// default manager and the first read per route after the idle span (as
// CSV comments with --csv, so that the CSV still parses).
func TestBenchIdleFigures(t *testing.T) {
	t.Setenv(asCLI, "1")
	for _, asCSV := range []bool{false, true} {
		args := []string{"bench", "--providers", "shm,tcp", "--ops", "read", "-S", "8", "-I", "20", "--idle", "200ms", "--timeout", "30s"}
		prefix := ""
		if asCSV {
			args, prefix = append(args, "--csv"), "# "
		}
		out, errOut, code := runCLI(args...)
		require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 5, out) // head, shm, tcp, two figures
		assert.Regexp(t, "^"+regexp.QuoteMeta(prefix)+`idle: a manager with default options used \d+\.\d\d% of a core over 200ms `, lines[3])
		us := `\d+\.\d\d usec \(max \d+\.\d\d\)`
		assert.Regexp(t, "^"+regexp.QuoteMeta(prefix)+`first 8 B read after 40ms idle, median of 5 \(owner a local serve\): shm `+us+`, tcp;ofi_rxm `+us+`$`, lines[4])
		if asCSV {
			r := csv.NewReader(strings.NewReader(out))
			r.Comment = '#'
			recs, err := r.ReadAll()
			require.NoError(t, err, out)
			assert.Len(t, recs, 3, out)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 123 45 0 0 20 0 3 0 100 0 0"
	d, err := parseStatCPU(stat)
	require.NoError(t, err)
	assert.Equal(t, 168*10*time.Millisecond, d)
	_, err = parseStatCPU("4242 (x) S 1")
	assert.Error(t, err)
}

// TestBenchRails runs `bench --rails 2` on a small lab: one row per op
// and size, each with the 1-rail and 2-rail figures, their ratio and the
// verdict, and the bytes each link carried. Its structure, not its
// speed: the figures are the measurement's, not the test's.
func TestBenchRails(t *testing.T) {
	testenv.RequireRoot(t)
	t.Setenv(asCLI, "1") // the bench's serve and clients are this test binary
	out, errOut, code := runCLI("bench", "--rails", "2", "--rail-rate", "100mbit", "-S", "1m,64k", "-I", "4", "-w", "1",
		"--repeat", "2", "--csv", "--timeout", "20s")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	r := csv.NewReader(strings.NewReader(out))
	r.Comment = '#'
	recs, err := r.ReadAll()
	require.NoError(t, err, out)
	assert.Contains(t, out, "# 2 veth links at 100mbit each way", out)
	require.Len(t, recs, 5, out) // head, read and write of 1m and 64k
	assert.Equal(t, []string{"test", "bytes", "iters", "window", "1-rail MB/sec", "2-rail MB/sec", "ratio", "ratio range", ">= 0.9", "2-rail link MB"}, recs[0])
	var got []string
	for _, rec := range recs[1:] {
		got = append(got, rec[0]+" "+rec[1]+" "+rec[2])
		num := func(v string) float64 {
			x, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, "%q in %v", v, rec)
			return x
		}
		num(rec[4]) // 1-rail MB/sec
		num(rec[5]) // 2-rail MB/sec
		lo, hi, ok := strings.Cut(rec[7], "-")
		require.True(t, ok, "ratio range %q", rec[7])
		assert.LessOrEqual(t, num(lo), num(rec[6]), "the median ratio is within the range: %v", rec)
		assert.GreaterOrEqual(t, num(hi), num(rec[6]), "the median ratio is within the range: %v", rec)
		assert.Regexp(t, `^\d+/\d+$`, rec[9], "what each link carried")
		if rec[1] == "1m" {
			assert.Contains(t, []string{"yes", "no"}, rec[8])
		} else {
			assert.Equal(t, "-", rec[8], "no target below 1 MiB")
		}
	}
	assert.Equal(t, []string{"read 1m 4", "read 64k 4", "write 1m 4", "write 64k 4"}, got)
	ns, err := exec.Command("ip", "netns", "list").Output()
	require.NoError(t, err)
	assert.NotRegexp(t, fmt.Sprintf(`(?m)^ftl[ab]%d[a-z] `, os.Getpid()%100000), string(ns), "the lab (netlab names it by pid) is gone")
}

// TestBenchRailsFlags: flags that do not fit --rails are usage errors,
// and --rail-rate reads tc's rates.
func TestBenchRailsFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--rails", "1"},
		{"--rails", "2", "--compare"},
		{"--rails", "2", "--ops", "pingpong"},
		{"--rails", "2", "--rail-rate", "50mbps"},
	} {
		_, errOut, code := runCLI(append([]string{"bench"}, args...)...)
		assert.Equal(t, exitUsage, code, "%v: %s", args, errOut)
	}
	for in, want := range map[string]float64{"400mbit": 50e6, "1gbit": 125e6, "1.5kbit": 187.5, "8bit": 1} {
		got, err := parseRate(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
}

// TestPeerCommands: each row of ours is compared with the fabtests run
// that measures the same thing — writes with -U -j 0 (delivery complete,
// each signaled) and, from 64 KiB, also without -U, as fabtests measures
// by default; reads without -U; mem and cma rows against shm; pingpongs
// with fi_rdm_pingpong and, where fabtests has it, fi_rma_pingpong with
// -U -j 0 (the RMA pingpong with acknowledged writes that is nearest).
func TestPeerCommands(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fi_rma_pingpong"), nil, 0o755))
	p := &peerTools{fabtestsDir: dir, warmup: 5, window: 64}
	row := func(op, prov string, size uint64) perftest.Row {
		return perftest.Row{Op: op, Provider: prov, Bytes: size, Iters: 100}
	}
	for _, tc := range []struct {
		r       perftest.Row
		second  bool
		name    string
		args    string
		twoRows bool
	}{
		{row("write", "shm", 8), false, "fi_rma_bw -U -j 0", "-p shm -e rdm -o write -S 8 -W 64 -I 100 -w 5 -U -j 0", false},
		{row("write", "shm", 1<<20), false, "fi_rma_bw -U -j 0", "-p shm -e rdm -o write -S 1048576 -W 64 -I 100 -w 5 -U -j 0", true},
		{row("write", "shm", 1<<20), true, "fi_rma_bw", "-p shm -e rdm -o write -S 1048576 -W 64 -I 100 -w 5", true},
		{row("write", "mem", 1<<20), true, "fi_rma_bw (shm)", "-p shm -e rdm -o write -S 1048576 -W 64 -I 100 -w 5", true},
		{row("read", "cma", 4096), false, "fi_rma_bw (shm)", "-p shm -e rdm -o read -S 4096 -W 64 -I 100 -w 5", false},
		{row("pingpong", "tcp;ofi_rxm", 8), false, "fi_rdm_pingpong", "-p tcp;ofi_rxm -S 8 -I 100 -w 5", true},
		{row("pingpong", "tcp;ofi_rxm", 8), true, "fi_rma_pingpong -U -j 0", "-p tcp;ofi_rxm -e rdm -o write -S 8 -I 100 -w 5 -U -j 0", true},
		{row("pingpong", "mem", 8), true, "fi_rma_pingpong -U -j 0 (shm)", "-p shm -e rdm -o write -S 8 -I 100 -w 5 -U -j 0", true},
	} {
		tool, args, name := p.command(tc.r, tc.second)
		assert.Equal(t, filepath.Join(dir, strings.Fields(name)[0]), tool)
		assert.Equal(t, tc.name, name)
		assert.Equal(t, tc.args, strings.Join(args, " "))
		assert.Equal(t, tc.twoRows, p.second(tc.r), "%s %d", tc.r.Op, tc.r.Bytes)
	}
	older := &peerTools{fabtestsDir: t.TempDir()} // fabtests before 1.21: no fi_rma_pingpong
	assert.False(t, older.second(row("pingpong", "shm", 8)))
	tool, _, _ := (&peerTools{}).command(row("read", "shm", 8), false)
	assert.Empty(t, tool, "no fabtests: nothing measures RMA bandwidth")
}
