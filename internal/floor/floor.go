// Package floor measures the floor under fitransfer's small ops: 8-byte
// RMA ops between this process and a child on raw libfabric endpoints,
// with no progress loop, no routing and no checks, each side spinning on
// one goroutine as fabtests' tools spin on one thread (yielding it to
// the Go scheduler every millisecond: yielder). fitransfer bench prints it
// next to its own window-1 and pingpong rows, paired run by run, so that
// what the engine adds is a ratio of the same run (docs/PERFORMANCE.md,
// "The floor next to every 8 B window-1 and pingpong row").
//
// The child is this program run again with PeerEnv set: a program that
// uses Measure must call ServePeer first thing in main (a test binary,
// in TestMain).
package floor

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fitransfer/fitransfer/fabric"
	"github.com/fitransfer/fitransfer/mr"
)

// Test is what Measure measures.
type Test string

const (
	// Write is 8-byte writes one at a time, each delivery complete, to a
	// child that only progresses its endpoint: under fitransfer's
	// window-1 writes.
	Write Test = "write"
	// Read is 8-byte reads one at a time from such a child.
	Read Test = "read"
	// PingPong is an 8-byte write pingpong with the child: each side
	// writes into the other's page and spins on its own byte.
	PingPong Test = "pingpong"
)

// PeerEnv, set to "TEST FLAGS PROVIDER" (FLAGS: the writes' completion
// flags, in decimal), makes ServePeer run this process as Measure's
// child.
const PeerEnv = "FITRANSFER_FLOOR_PEER"

// Timeout bounds each wait of either side for the other.
const Timeout = 10 * time.Second

// warmFor: both sides run this long before the timed ops, so that the Go
// runtime's monitor thread has settled after the start-up's blocking
// (docs/PERFORMANCE.md, "Stalls in short runs").
const warmFor = 50 * time.Millisecond

// endMark is the write that ends a one-at-a-time child's wait; the
// writes before it cycle through 1..endMark-1.
const endMark = 0xfe

// Measure runs n timed ops of test over prov against a child started
// from exe (with args, and PeerEnv set) and returns the µs an op takes:
// half a round trip for PingPong, as fabtests count. Writes (a
// pingpong's too) ask for the completion flags, which the caller picks
// as fitransfer would for the same op; the endpoints are opened with
// fitransfer's hints (hints).
func Measure(ctx context.Context, exe string, args []string, prov string, test Test, n int, flags fabric.OpFlags) (float64, error) {
	switch test {
	case Write, Read, PingPong:
	default:
		return 0, fmt.Errorf("floor: unknown test %q", test)
	}
	if n < 1 {
		return 0, fmt.Errorf("floor: %d ops", n)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*Timeout+time.Duration(n)*time.Millisecond)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %s", PeerEnv, test, flags, prov))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("floor: starting its peer: %w", err)
	}
	usec, err := measure(ctx, bufio.NewReader(out), in, prov, test, n, flags)
	in.Close() // the child's end: it stops waiting
	if werr := cmd.Wait(); werr != nil {
		peerErr := fmt.Errorf("floor: its peer: %w: %s", werr, lastLine(stderr.String()))
		if err == nil {
			err = peerErr
		} else {
			err = fmt.Errorf("%w (%w)", err, peerErr)
		}
	}
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("floor: %w (%w)", ctx.Err(), err)
	}
	return usec, err
}

func measure(ctx context.Context, r *bufio.Reader, w io.Writer, prov string, test Test, n int, flags fabric.OpFlags) (float64, error) {
	s, err := setup(prov, flags, r, w)
	if err != nil {
		return 0, err
	}
	defer s.close()
	if test == Read {
		s.op.Write, s.op.Flags = false, uint64(fabric.OpCompletion)
		s.q.Set(0, &s.op)
	}
	// Marks: a pingpong's first round is 0xff (both sides are up) and
	// its last write 0 (the child exits); the warm-up's are
	// 1..0x7f, the timed ones 0x80..0xfd, so that two in a row always
	// differ and none is a one-at-a-time child's endMark.
	one := func(mark byte) error {
		s.yield.maybe()
		if err := s.write(ctx, mark); err != nil || test != PingPong { // a read, for reads
			return err
		}
		return s.await(ctx, mark)
	}
	if test == PingPong {
		if err := one(0xff); err != nil {
			return 0, err
		}
	}
	for i, start := 0, time.Now(); time.Since(start) < warmFor; i++ {
		if err := one(byte(1 + i%0x7f)); err != nil {
			return 0, err
		}
	}
	begin := time.Now()
	for i := 0; i < n; i++ {
		if err := one(byte(0x80 + i%0x7e)); err != nil {
			return 0, err
		}
	}
	elapsed := time.Since(begin)
	if test == PingPong {
		// The last mark ends the child, which does not answer it: an
		// answer still in the child's provider as it exits would be lost.
		if err := s.write(ctx, 0); err != nil {
			return 0, err
		}
		return float64(elapsed.Nanoseconds()) / float64(2*n) / 1000, nil
	}
	s.op.Write, s.op.Flags = true, uint64(fabric.OpCompletion|flags)
	s.q.Set(0, &s.op)
	if err := s.write(ctx, endMark); err != nil {
		return 0, err
	}
	return float64(elapsed.Nanoseconds()) / float64(n) / 1000, nil
}

// ServePeer runs this process as Measure's child when PeerEnv is set,
// and reports whether it was; it then returns when the parent is done
// (or with the error that ended it).
func ServePeer() (bool, error) {
	v, ok := os.LookupEnv(PeerEnv)
	if !ok {
		return false, nil
	}
	var test Test
	var flags fabric.OpFlags
	var prov string
	if _, err := fmt.Sscanf(v, "%s %d %s", &test, &flags, &prov); err != nil {
		return true, fmt.Errorf("floor peer: %s=%q: %w", PeerEnv, v, err)
	}
	r := bufio.NewReader(os.Stdin)
	s, err := setup(prov, flags, r, os.Stdout)
	if err != nil {
		return true, err
	}
	defer s.close()
	// The parent closes stdin when it is done, or when it failed: this
	// process must not spin on then.
	ctx, parentGone := context.WithCancel(context.Background())
	defer parentGone()
	go func() {
		_, _ = io.Copy(io.Discard, r)
		parentGone()
	}()
	if test != PingPong {
		for i := 1; s.mark() != endMark; i++ {
			_, _ = s.q.Reap(s.ep)
			s.yield.maybe()
			if i&4095 == 0 && ctx.Err() != nil {
				return true, nil
			}
		}
		s.drain(ctx)
		return true, nil
	}
	if err := s.answer(ctx); err != nil && ctx.Err() == nil {
		return true, err
	}
	// The parent left: whatever ended the answers then (its last mark
	// may have gone with its endpoint), it reports its own result.
	return true, nil
}

// answer is the child's side of a pingpong: it answers each mark of the
// parent's until the last (0), which needs no answer.
func (s *side) answer(ctx context.Context) error {
	if err := s.await(ctx, 0xff); err != nil {
		return err
	}
	if err := s.write(ctx, 0xff); err != nil {
		return err
	}
	for m := byte(0xff); ; {
		// The parent's warm-up runs for a time, not a count.
		var err error
		if m, err = s.next(ctx, m); err != nil {
			return err
		}
		if m == 0 {
			s.drain(ctx)
			return nil
		}
		if err := s.write(ctx, m); err != nil {
			return err
		}
		s.yield.maybe()
	}
}

// side is one process's endpoint and registered page: it writes its
// bytes 64..71 into the peer's 0..7 and watches its own byte 7.
type side struct {
	f   *fabric.Fabric
	d   *fabric.Domain
	ep  *fabric.Endpoint
	q   *fabric.Queue
	mr  *fabric.MR
	buf []byte
	op  fabric.Op
	// yield: the side spins on one goroutine for the whole run.
	yield yielder
}

// yielder yields a spinning goroutine's thread to the Go scheduler
// (runtime.Gosched) every millisecond, as transport's drivers do
// (progress's yieldShared): one that runs for the runtime's 10 ms time
// slice mostly inside cgo calls has its P retaken by sysmon, which
// then wakes every few tens of microseconds, each time taking a CPU
// from one of the two spinning sides on a small host. A floor that paid
// for that would not be the floor.
type yielder struct {
	looks int
	last  time.Time
}

// maybe yields if a millisecond has passed since the last yield; it
// reads the clock every 64th call.
func (y *yielder) maybe() {
	if y.looks++; y.looks&63 != 0 {
		return
	}
	if now := time.Now(); now.Sub(y.last) >= time.Millisecond {
		runtime.Gosched()
		y.last = now
	}
}

// setup opens an endpoint of prov with a registered page, tells the
// peer (on w) its address, the page's address and key, and reads the
// peer's (from r). Its op is an 8-byte write with a completion and
// flags.
func setup(prov string, flags fabric.OpFlags, r *bufio.Reader, w io.Writer) (*side, error) {
	infos, err := fabric.GetInfo(fabric.Query{Hints: Hints(prov)})
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	s := &side{}
	if err := s.open(&infos[0], flags, r, w); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// open is setup's work on s; what it opened, s.close closes.
func (s *side) open(info *fabric.Info, flags fabric.OpFlags, r *bufio.Reader, w io.Writer) (err error) {
	if s.f, err = fabric.OpenFabric(info); err != nil {
		return err
	}
	if s.d, err = s.f.OpenDomain(info); err != nil {
		return err
	}
	if s.ep, err = s.d.OpenEndpoint(256, false, fabric.EndpointOptions{}); err != nil {
		return err
	}
	s.q = fabric.NewQueue(16, 64)
	if s.buf, err = unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON); err != nil {
		return err
	}
	var bindTo *fabric.Endpoint
	if info.Domain.MRMode.Has(fabric.MREndpoint) {
		bindTo = s.ep
	}
	if s.mr, err = s.d.RegMR(mr.Addr(s.buf), 4096,
		fabric.AccessRead|fabric.AccessWrite|fabric.AccessRemoteRead|fabric.AccessRemoteWrite, 7, fabric.HMEMSystem, 0, bindTo); err != nil {
		return err
	}
	addr := uint64(0)
	if info.Domain.MRMode.Has(fabric.MRVirtAddr) {
		addr = uint64(mr.Addr(s.buf))
	}
	if _, err = fmt.Fprintf(w, "%s %d %d\n", hex.EncodeToString(s.ep.Name()), addr, s.mr.Key()); err != nil {
		return fmt.Errorf("floor: sending the peer this side's address: %w", err)
	}
	var name string
	var peerAddr, peerKey uint64
	if _, err = fmt.Fscanln(r, &name, &peerAddr, &peerKey); err != nil {
		return fmt.Errorf("floor: the peer's address: %w", err)
	}
	raw, err := hex.DecodeString(name)
	if err != nil {
		return err
	}
	peer, err := s.ep.InsertAddr(raw)
	if err != nil {
		return err
	}
	s.op = fabric.Op{Local: mr.Addr(s.buf[64:]), Len: 8, Desc: s.mr.Desc(), Remote: peerAddr, Key: peerKey,
		Peer: peer, Flags: uint64(fabric.OpCompletion | flags), Slot: 1, Write: true}
	s.q.Set(0, &s.op)
	return nil
}

// Hints are fitransfer's for prov (transport's discover), which the
// floor's endpoints are opened with: its RMA hints, and on libfabric 2.x
// read-after-read order for shm, which turns off shm's fast RMA (the
// target copies, and checks the key).
func Hints(prov string) *fabric.Info {
	h := fabric.RMAHints(prov)
	if prov == string(fabric.BackendSHM) && fabric.RuntimeVersion().Major() >= 2 {
		fabric.WithoutShmFastRMA(h)
	}
	return h
}

func (s *side) close() {
	if s.mr != nil {
		s.mr.Close()
	}
	if s.ep != nil {
		s.ep.Close()
	}
	if s.q != nil {
		s.q.Free()
	}
	if s.d != nil {
		s.d.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
	if s.buf != nil {
		_ = unix.Munmap(s.buf)
	}
}

// mark is this side's byte 7, loaded atomically: a peer's RMA writes it.
func (s *side) mark() byte {
	w, shift := mr.Word32(s.buf, 7)
	return byte(atomic.LoadUint32(w) >> shift)
}

// write writes mark into the peer's byte 7 (the op's, a read for
// reads) and reaps its completion, within Timeout and while ctx lasts.
func (s *side) write(ctx context.Context, mark byte) error {
	s.buf[71] = mark
	var deadline time.Time
	for i := 1; ; i++ {
		n, err := s.q.Post(s.ep, 1)
		if n == 1 {
			break
		}
		if !errors.Is(err, fabric.ErrAgain) {
			return fmt.Errorf("floor: post: %w", err)
		}
		_, _ = s.q.Reap(s.ep)
		if err := expired(ctx, i, &deadline); err != nil {
			return err
		}
	}
	for i := 1; ; i++ {
		slots, err := s.q.Reap(s.ep)
		if err != nil {
			return fmt.Errorf("floor: completion: %w", err)
		}
		if len(slots) == 1 {
			return nil
		}
		if err := expired(ctx, i, &deadline); err != nil {
			return err
		}
	}
}

// await spins on its own byte 7, progressing the endpoint, until it is
// mark.
func (s *side) await(ctx context.Context, mark byte) error {
	var deadline time.Time
	for i := 1; s.mark() != mark; i++ {
		_, _ = s.q.Reap(s.ep)
		if err := expired(ctx, i, &deadline); err != nil {
			return err
		}
	}
	return nil
}

// next spins until its own byte 7 is other than last, the mark it
// answered last (the next may have landed before that answer's
// completion), and returns it.
func (s *side) next(ctx context.Context, last byte) (byte, error) {
	var deadline time.Time
	for i := 1; ; i++ {
		if m := s.mark(); m != last {
			return m, nil
		}
		_, _ = s.q.Reap(s.ep)
		if err := expired(ctx, i, &deadline); err != nil {
			return 0, err
		}
	}
}

// drain progresses the endpoint until the parent leaves (or Timeout):
// the parent's last write may complete only through this side's
// progress (a delivery-complete write over shm on libfabric 2.x).
func (s *side) drain(ctx context.Context) {
	var deadline time.Time
	for i := 1; expired(ctx, i, &deadline) == nil; i++ {
		_, _ = s.q.Reap(s.ep)
	}
}

// expired reads the clock every 4096th look (a look takes well under a
// microsecond) and fails once Timeout has passed since the first read,
// or ctx ended.
func expired(ctx context.Context, i int, deadline *time.Time) error {
	if i&4095 != 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if deadline.IsZero() {
		*deadline = time.Now().Add(Timeout)
	} else if time.Now().After(*deadline) {
		return fmt.Errorf("floor: the other process did not answer within %v", Timeout)
	}
	return nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
