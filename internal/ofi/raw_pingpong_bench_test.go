package ofi

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// rawPeerEnv makes TestRawPingPongPeer the other process of
// BenchmarkRawPingPong; its value is the provider.
const rawPeerEnv = "FITRANSFER_RAW_PINGPONG_PEER"

// rawProviders are the providers BenchmarkRawPingPong measures.
var rawProviders = []string{"shm", "tcp;ofi_rxm"}

// pingSide is one process's half of the raw pingpong: it writes its
// bytes 64..71 into the peer's 0..7 and watches its own byte 7.
type pingSide struct {
	s   *side
	buf []byte
	op  Op
}

// rawSetup opens an endpoint of prov with a registered page (its hints
// asking for order), tells the peer (on w) its address, the page's
// address and key, and reads the peer's (from r). Its op is an 8-byte
// write with a completion and flags.
func rawSetup(t testing.TB, prov string, order MsgOrder, flags OpFlags, r *bufio.Reader, w io.Writer) *pingSide {
	info := rmaInfo(t, prov, order)
	p := &pingSide{s: openSide(t, info), buf: mmap(t, 4096)}
	var bindTo *Endpoint
	if info.Domain.MRMode.Has(MREndpoint) {
		bindTo = p.s.ep
	}
	mr, err := p.s.d.RegMR(uintptr(unsafe.Pointer(&p.buf[0])), 4096, AccessRead|AccessWrite|AccessRemoteRead|AccessRemoteWrite, 7, HMEMSystem, 0, bindTo)
	require.NoError(t, err)
	t.Cleanup(func() { mr.Close() })
	addr := uint64(0)
	if info.Domain.MRMode.Has(MRVirtAddr) {
		addr = uint64(uintptr(unsafe.Pointer(&p.buf[0])))
	}
	_, err = fmt.Fprintf(w, "%s %d %d\n", hex.EncodeToString(p.s.ep.Name()), addr, mr.Key())
	require.NoError(t, err)
	var name string
	var peerAddr, peerKey uint64
	_, err = fmt.Fscanln(r, &name, &peerAddr, &peerKey)
	require.NoError(t, err)
	raw, err := hex.DecodeString(name)
	require.NoError(t, err)
	peer, err := p.s.ep.InsertAddr(raw)
	require.NoError(t, err)
	p.op = Op{Local: uintptr(unsafe.Pointer(&p.buf[64])), Len: 8, Desc: mr.Desc(), Remote: peerAddr, Key: peerKey,
		Peer: peer, Flags: uint64(OpCompletion | flags), Slot: 1, Write: true}
	p.s.q.Set(0, &p.op)
	return p
}

// write writes mark into the peer's byte 7, delivery complete, and reaps
// the completion.
func (p *pingSide) write(t testing.TB, mark byte) {
	p.buf[71] = mark
	for {
		n, err := p.s.q.Post(p.s.ep, 1)
		if n == 1 {
			break
		}
		if !errors.Is(err, ErrAgain) {
			t.Fatalf("post: %v", err) // not require: its Helper call would be most of a round
		}
		_, _ = p.s.q.Reap(p.s.ep)
	}
	for {
		slots, err := p.s.q.Reap(p.s.ep)
		if err != nil {
			t.Fatalf("reap: %v", err)
		}
		if len(slots) == 1 {
			return
		}
	}
}

// await spins on its own byte 7, progressing the endpoint, until it is
// mark; it fails when the byte has not changed for awaitTimeout (the
// other process died, say).
func (p *pingSide) await(t testing.TB, mark byte) {
	w := (*uint32)(unsafe.Pointer(&p.buf[4]))
	var deadline time.Time
	for i := 1; byte(atomic.LoadUint32(w)>>24) != mark; i++ {
		_, _ = p.s.q.Reap(p.s.ep)
		if i&4095 == 0 { // the clock is read rarely: a round trip takes a microsecond
			if deadline.IsZero() {
				deadline = time.Now().Add(awaitTimeout)
			} else if time.Now().After(deadline) {
				t.Fatalf("the other process's write %d did not arrive within %v", mark, awaitTimeout)
			}
		}
	}
}

// startRawPeer starts this test binary as a raw benchmark's other
// process: test (a Test function, which does nothing without env) with
// env set to prov. It returns the child's stdin and stdout, and a func
// that waits for it to exit (after stdin is closed).
func startRawPeer(b *testing.B, test, env, prov string) (io.WriteCloser, *bufio.Reader, func()) {
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$")
	cmd.Env = append(os.Environ(), env+"="+prov)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	return in, bufio.NewReader(out), func() { require.NoError(b, cmd.Wait()) }
}

// pingWriteFlags is the completion fitransfer's pingpong writes ask for
// (transport.Action.InjectComplete): over tcp;ofi_rxm only that the
// source may be reused, which spares each write the owner's
// acknowledgement; over shm InjectComplete leaves them delivery complete
// (docs/PERFORMANCE.md says why).
func pingWriteFlags(prov string) OpFlags {
	if prov == "tcp;ofi_rxm" {
		return OpInjectComplete
	}
	return OpDeliveryComplete
}

// awaitTimeout bounds each wait of BenchmarkRawPingPong's sides.
const awaitTimeout = 10 * time.Second

// BenchmarkRawPingPong is the floor under fitransfer's pingpong over shm
// and tcp with this Go and cgo: an 8-byte RMA write pingpong between this
// process and a child, each write asking for the completion fitransfer's
// ask for (pingWriteFlags), on raw endpoints (no progress loop, no
// routing), each side spinning on one locked thread as fi_rma_pingpong's
// sides do. An op is a
// round trip; usec/xfer is half of one, as fabtests count.
func BenchmarkRawPingPong(b *testing.B) {
	for _, prov := range rawProviders {
		b.Run(prov, func(b *testing.B) {
			in, out, wait := startRawPeer(b, "TestRawPingPongPeer", rawPeerEnv, prov)
			defer wait()
			defer in.Close()
			p := rawSetup(b, prov, 0, pingWriteFlags(prov), out, in)
			_, err := fmt.Fprintln(in, b.N)
			require.NoError(b, err)
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			p.write(b, 0xff) // both sides are up
			p.await(b, 0xff)
			b.ResetTimer()
			for i := 1; i <= b.N; i++ {
				p.write(b, byte(i))
				p.await(b, byte(i))
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N)/1000, "usec/xfer")
		})
	}
}

// TestRawPingPongPeer is BenchmarkRawPingPong's other process; run
// without rawPeerEnv it has nothing to do.
func TestRawPingPongPeer(t *testing.T) {
	prov := os.Getenv(rawPeerEnv)
	if prov == "" {
		return
	}
	r := bufio.NewReader(os.Stdin)
	p := rawSetup(t, prov, 0, pingWriteFlags(prov), r, os.Stdout)
	var n int
	_, err := fmt.Fscanln(r, &n)
	require.NoError(t, err)
	runtime.LockOSThread()
	p.await(t, 0xff)
	p.write(t, 0xff)
	for i := 1; i <= n; i++ {
		p.await(t, byte(i))
		p.write(t, byte(i))
	}
}

// rawOneEnv makes TestRawOneAtATimePeer the target of
// BenchmarkRawOneAtATime; its value is the provider.
const rawOneEnv = "FITRANSFER_RAW_ONE_PEER"

// rawOneEnd is the mark of BenchmarkRawOneAtATime's last write, which
// ends the target's wait; the writes before it cycle through
// 1..rawOneEnd-1.
const rawOneEnd = 0xfe

// BenchmarkRawOneAtATime is the floor under fitransfer's window-1 reads
// and writes over shm and tcp with this Go and cgo: 8-byte RMA ops, one
// at a time (posted, then reaped), from this process to a child that
// only progresses its endpoint, as fi_rma_bw -W 1's target does. Writes
// are delivery complete, as fitransfer's are (fi_rma_bw -U -j 0). The
// endpoints ask for read-after-read order, as fitransfer's shm endpoints
// do (fabric.WithoutShmFastRMA): shm's fast RMA, where the initiator
// copies, is off, and the target copies. No progress loop, no routing,
// one locked thread a side.
func BenchmarkRawOneAtATime(b *testing.B) {
	for _, op := range []string{"write", "read"} {
		for _, prov := range rawProviders {
			b.Run(op+"/"+prov, func(b *testing.B) {
				in, out, wait := startRawPeer(b, "TestRawOneAtATimePeer", rawOneEnv, prov)
				defer wait()
				defer in.Close()
				p := rawSetup(b, prov, OrderRAR, OpDeliveryComplete, out, in)
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				if op == "read" {
					p.op.Write, p.op.Flags = false, uint64(OpCompletion)
					p.s.q.Set(0, &p.op) // (Set copies the op)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					p.write(b, byte(1+i%(rawOneEnd-1))) // (a read, for reads)
				}
				b.StopTimer()
				p.op.Write, p.op.Flags = true, uint64(OpCompletion|OpDeliveryComplete)
				p.s.q.Set(0, &p.op)
				p.write(b, rawOneEnd)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "usec/xfer")
			})
		}
	}
}

// TestRawOneAtATimePeer is BenchmarkRawOneAtATime's target; run without
// rawOneEnv it has nothing to do.
func TestRawOneAtATimePeer(t *testing.T) {
	prov := os.Getenv(rawOneEnv)
	if prov == "" {
		return
	}
	r := bufio.NewReader(os.Stdin)
	p := rawSetup(t, prov, OrderRAR, OpDeliveryComplete, r, os.Stdout)
	// The parent closes stdin when it is done, or when it failed before
	// its last write: then this process must not spin on.
	var parentGone atomic.Bool
	go func() {
		_, _ = io.Copy(io.Discard, r)
		parentGone.Store(true)
	}()
	runtime.LockOSThread()
	w := (*uint32)(unsafe.Pointer(&p.buf[4]))
	for byte(atomic.LoadUint32(w)>>24) != rawOneEnd && !parentGone.Load() {
		_, _ = p.s.q.Reap(p.s.ep)
	}
}
