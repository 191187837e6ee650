package transport_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"strconv"

	"github.com/fitransfer/fitransfer/internal/testpeer"
	"github.com/fitransfer/fitransfer/mr"
	"github.com/fitransfer/fitransfer/transport"
)

// Each example is one side of an owner and a peer, each a process of its
// own: the other side runs ownerProgram or peerProgram (below) in this
// test binary started again.

// A peer reads and writes an owner's memory with nothing but its handle:
// the owner's program takes no part in the transfers. (The owner's side is
// the example of Manager.Register.)
func Example() {
	// The owner registered a buffer holding "hello from the owner" and sent
	// its handle over a pipe: any channel will do (docs/handle.md).
	owner := startOwner("hello from the owner")
	defer owner.Close()

	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	var remote transport.RemoteBuffer
	if err := remote.UnmarshalBinary(owner.Handle()); err != nil {
		log.Fatal(err)
	}

	// The peer's side of a transfer is registered memory too, off the Go
	// heap; access 0: no other process may read or write it.
	mem, err := mr.Alloc(int(remote.Len()))
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Free(mem)
	local, err := m.Register(mem, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()

	if err := m.ReadInto(ctx, local, remote); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("read: %q\n", local.Bytes())

	copy(local.Bytes(), "hello from the peer!")
	if err := m.WriteFrom(ctx, remote, local); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("the owner's buffer holds: %q\n", owner.Holds())
	// Output:
	// read: "hello from the owner"
	// the owner's buffer holds: "hello from the peer!"
}

// An owner registers memory and hands its handle to peers, which read and
// write it without the owner's program taking part. The memory is freed
// only after Close.
func ExampleManager_Register() {
	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	mem, err := mr.Alloc(20)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Free(mem)
	copy(mem, "hello from the owner")
	buf, err := m.Register(mem, mr.ReadWrite) // peers may read and write it
	if err != nil {
		log.Fatal(err)
	}
	defer buf.Close()

	handle, err := buf.Remote().MarshalBinary()
	if err != nil {
		log.Fatal(err)
	}
	// Send the handle to a peer any way you like (docs/handle.md). This
	// peer reads the buffer, writes its own greeting into it, and says
	// what it read.
	peerRead := runPeer(handle)
	fmt.Printf("the peer read: %q\n", peerRead)
	fmt.Printf("the buffer holds: %q\n", mem)
	// Output:
	// the peer read: "hello from the owner"
	// the buffer holds: "hello from the peer!"
}

// A RemoteBuffer is sliced like the buffer it names: a peer reads any
// range of the owner's buffer.
func ExampleManager_ReadInto() {
	owner := startOwner("0123456789abcdef")
	defer owner.Close()

	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	var remote transport.RemoteBuffer
	if err := remote.UnmarshalBinary(owner.Handle()); err != nil {
		log.Fatal(err)
	}
	letters, err := remote.Slice(10, 6)
	if err != nil {
		log.Fatal(err)
	}

	mem, err := mr.Alloc(int(letters.Len()))
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Free(mem)
	local, err := m.Register(mem, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()

	// ReadInto returns when the bytes are in local.
	if err := m.ReadInto(ctx, local, letters); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%q\n", local.Bytes())
	// Output: "abcdef"
}

// A nil error from WriteFrom means the bytes are in the owner's memory
// (FI_DELIVERY_COMPLETE): the owner sees them at once.
func ExampleManager_WriteFrom() {
	owner := startOwner("status: pending")
	defer owner.Close()

	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	var remote transport.RemoteBuffer
	if err := remote.UnmarshalBinary(owner.Handle()); err != nil {
		log.Fatal(err)
	}
	status, err := remote.Slice(8, 7)
	if err != nil {
		log.Fatal(err)
	}

	mem, err := mr.Alloc(7)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Free(mem)
	copy(mem, "running")
	local, err := m.Register(mem, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()

	if err := m.WriteFrom(ctx, status, local); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("the owner's buffer holds: %q\n", owner.Holds())
	// Output: the owner's buffer holds: "status: running"
}

// An Action submits many reads and writes at once: all are checked before
// any moves, they run in parallel, and Submit returns when all are done.
// Slices of one registered buffer serve as the local side of each.
func ExampleAction() {
	owner := startOwner("first second ______")
	defer owner.Close()

	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	var remote transport.RemoteBuffer
	if err := remote.UnmarshalBinary(owner.Handle()); err != nil {
		log.Fatal(err)
	}
	theirFirst, err1 := remote.Slice(0, 5)
	theirSecond, err2 := remote.Slice(6, 6)
	theirBlank, err3 := remote.Slice(13, 6)
	if err := errors.Join(err1, err2, err3); err != nil {
		log.Fatal(err)
	}

	mem, err := mr.Alloc(17)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Free(mem)
	local, err := m.Register(mem, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer local.Close()
	first, err1 := local.Slice(0, 5)
	second, err2 := local.Slice(5, 6)
	third, err3 := local.Slice(11, 6)
	if err := errors.Join(err1, err2, err3); err != nil {
		log.Fatal(err)
	}
	copy(third.Bytes(), "third!")

	err = m.NewAction().
		ReadInto(first, theirFirst).
		ReadInto(second, theirSecond).
		WriteFrom(theirBlank, third).
		Submit(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("read %q and %q\n", first.Bytes(), second.Bytes())
	fmt.Printf("the owner's buffer holds: %q\n", owner.Holds())
	// Output:
	// read "first" and "second"
	// the owner's buffer holds: "first second third!"
}

// ownerProgram is the owner's program: it registers a buffer holding text
// that peers may read and write, sends the buffer's handle to its peer (a
// line of hex on conn), and keeps the buffer registered until the peer
// hangs up. Each line the peer sends asks what the buffer holds now.
func ownerProgram(conn io.ReadWriter, text string) error {
	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		return err
	}
	defer m.Close()

	mem, err := mr.Alloc(len(text))
	if err != nil {
		return err
	}
	defer mr.Free(mem)
	copy(mem, text)
	buf, err := m.Register(mem, mr.ReadWrite)
	if err != nil {
		return err
	}
	defer buf.Close()

	handle, err := buf.Remote().MarshalBinary()
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(conn, "%x\n", handle); err != nil {
		return err
	}
	peer := bufio.NewScanner(conn)
	for peer.Scan() {
		if _, err := fmt.Fprintf(conn, "%q\n", mem); err != nil {
			return err
		}
	}
	return peer.Err()
}

// peerProgram is the peer's program of the Manager.Register example:
// given the handle of an owner's buffer, it reads the buffer, writes its
// greeting into it, and then tells what it read (a line on conn).
func peerProgram(conn io.ReadWriter, handle []byte) error {
	ctx := context.Background()
	m, err := transport.New(ctx)
	if err != nil {
		return err
	}
	defer m.Close()

	var remote transport.RemoteBuffer
	if err := remote.UnmarshalBinary(handle); err != nil {
		return err
	}
	mem, err := mr.Alloc(int(remote.Len()))
	if err != nil {
		return err
	}
	defer mr.Free(mem)
	local, err := m.Register(mem, 0)
	if err != nil {
		return err
	}
	defer local.Close()

	if err := m.ReadInto(ctx, local, remote); err != nil {
		return err
	}
	read := string(mem)
	copy(mem, "hello from the peer!")
	if err := m.WriteFrom(ctx, remote, local); err != nil {
		return err
	}
	_, err = fmt.Fprintf(conn, "%q\n", read)
	return err
}

// The plumbing of the examples: the programs run in this test binary
// started again (testpeer.StartFunc), their stdin and stdout the other
// side's line to them.

func init() {
	testpeer.Register("example owner", func(conn io.ReadWriter, args []string) error {
		return ownerProgram(conn, args[0])
	})
	testpeer.Register("example peer", func(conn io.ReadWriter, args []string) error {
		handle, err := hex.DecodeString(args[0])
		if err != nil {
			return err
		}
		return peerProgram(conn, handle)
	})
}

// runPeer runs a peer process on the handle and returns what it read.
func runPeer(handle []byte) string {
	p, err := testpeer.StartFunc("example peer", hex.EncodeToString(handle))
	if err != nil {
		log.Fatal(err)
	}
	line, err := p.ReadLine()
	if err != nil {
		log.Fatal(err)
	}
	if err := p.Close(); err != nil {
		log.Fatalf("peer process: %v", err)
	}
	read, err := strconv.Unquote(line)
	if err != nil {
		log.Fatalf("peer's answer %q: %v", line, err)
	}
	return read
}

// ownerProcess is a peer's end of the line to an owner process.
type ownerProcess struct {
	p      *testpeer.Process
	handle []byte
}

// startOwner starts an owner process whose buffer holds text and reads
// the buffer's handle; an example that cannot have its owner ends there.
func startOwner(text string) *ownerProcess {
	p, err := testpeer.StartFunc("example owner", text)
	if err != nil {
		log.Fatal(err)
	}
	line, err := p.ReadLine()
	if err != nil {
		log.Fatal(err)
	}
	handle, err := hex.DecodeString(line)
	if err != nil {
		log.Fatalf("owner's handle %q: %v", line, err)
	}
	return &ownerProcess{p: p, handle: handle}
}

// Handle is the handle of the owner's buffer.
func (o *ownerProcess) Handle() []byte { return o.handle }

// Holds asks the owner what its buffer holds now.
func (o *ownerProcess) Holds() string {
	if err := o.p.WriteLine("?"); err != nil {
		log.Fatal(err)
	}
	line, err := o.p.ReadLine()
	if err != nil {
		log.Fatal(err)
	}
	s, err := strconv.Unquote(line)
	if err != nil {
		log.Fatalf("owner's answer %q: %v", line, err)
	}
	return s
}

// Close ends the owner process; an owner that failed ends the example.
func (o *ownerProcess) Close() {
	if err := o.p.Close(); err != nil {
		log.Fatalf("owner process: %v", err)
	}
}
