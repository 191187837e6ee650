// Package bootstrap is the out-of-band protocol `fitransfer serve` and its
// clients speak over TCP before and around the RMA traffic: exchange
// endpoint names (both sides insert the other before any RMA, as EFA
// requires), hand out the buffer handle, and ask the server to fill or
// verify its buffer.
//
// Each message is a frame: a 4-byte big-endian length, then that many
// bytes of JSON (at most MaxFrame). Every message carries the protocol
// version; a peer with another version gets an error message naming both.
// Every read has a deadline.
package bootstrap

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/fitransfer/fitransfer/transport"
)

// Version is the protocol version this package speaks.
const Version = 1

// MaxFrame bounds a message's size.
const MaxFrame = 64 << 10

// DefaultPort is the TCP port `fitransfer serve` listens on by default.
const DefaultPort = 47580

// Message types.
const (
	TypeHello    = "hello"    // client → server: mode, the client's address (and its buffer for pingpong)
	TypeWelcome  = "welcome"  // server → client: the session buffer's handle, the server's address
	TypeFill     = "fill"     // client → server: fill the buffer with the pattern of Seed
	TypeFilled   = "filled"   // server → client
	TypeVerify   = "verify"   // client → server: does [Offset, Offset+Size) hold the pattern of Seed?
	TypeVerified = "verified" // server → client: OK, or the first Mismatch offset
	TypePingPong = "pingpong" // client → server: answer Iters writes of Size bytes
	TypeDone     = "done"     // server → client: pingpong answered
	TypeBye      = "bye"      // client → server: end of session
	TypeError    = "error"    // either way: Error says what went wrong
	// A server with a shared secret answers a hello with a challenge
	// (a random Nonce), and the client proves it holds the secret with
	// auth (Proof, see Proof) before the server does anything for it.
	TypeChallenge = "challenge" // server → client
	TypeAuth      = "auth"      // client → server
)

// Modes of a session.
const (
	ModeRead     = "read"
	ModeWrite    = "write"
	ModePingPong = "pingpong"
)

// Message is every message of the protocol; fields are set per type.
type Message struct {
	V        int                `json:"v"`
	Type     string             `json:"type"`
	Mode     string             `json:"mode,omitempty"`
	Size     uint64             `json:"size,omitempty"`
	Offset   uint64             `json:"offset,omitempty"`
	Seed     uint64             `json:"seed,omitempty"`
	Iters    int                `json:"iters,omitempty"`
	Handle   []byte             `json:"handle,omitempty"` // RemoteBuffer, binary form
	Address  *transport.Address `json:"address,omitempty"`
	OK       bool               `json:"ok,omitempty"`
	Mismatch int64              `json:"mismatch,omitempty"`
	Error    string             `json:"error,omitempty"`
	Nonce    []byte             `json:"nonce,omitempty"`
	Proof    []byte             `json:"proof,omitempty"`
}

// NonceSize is the length of a challenge's nonce.
const NonceSize = 32

// Proof is what a client holding token answers to a challenge's nonce:
// HMAC-SHA256 of the nonce under the token, with a label so that the
// value means nothing to any other protocol.
func Proof(token string, nonce []byte) []byte {
	h := hmac.New(sha256.New, []byte(token))
	h.Write([]byte("fitransfer bootstrap auth v1\x00"))
	h.Write(nonce)
	return h.Sum(nil)
}

// ProofOK compares a client's proof with the expected one in constant
// time.
func ProofOK(token string, nonce, proof []byte) bool {
	return hmac.Equal(Proof(token, nonce), proof)
}

// ErrFrameTooLarge is a frame longer than MaxFrame.
var ErrFrameTooLarge = errors.New("frame too large")

// VersionError is a message of another protocol version.
type VersionError struct{ Got int }

func (e *VersionError) Error() string {
	return fmt.Sprintf("protocol version %d; this fitransfer speaks version %d (use the same fitransfer on both hosts)", e.Got, Version)
}

// ReadFrame reads one length-prefixed frame.
func ReadFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes (at most %d): not a fitransfer peer?", ErrFrameTooLarge, n, MaxFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// Decode parses a frame's payload and checks its version and type.
func Decode(b []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		return Message{}, fmt.Errorf("not a fitransfer message: %w", err)
	}
	if m.V != Version {
		return m, &VersionError{Got: m.V}
	}
	if m.Type == "" {
		return m, errors.New("message without a type")
	}
	return m, nil
}

// Conn is one side of a bootstrap connection.
type Conn struct {
	c       net.Conn
	r       *bufio.Reader // keeps what a Pending or a timed-out read got
	timeout time.Duration
}

// NewConn wraps c; timeout bounds every read and write that does not
// give its own.
func NewConn(c net.Conn, timeout time.Duration) *Conn {
	return &Conn{c: c, r: bufio.NewReader(c), timeout: timeout}
}

// Dial connects to a server within timeout.
func Dial(addr string, timeout time.Duration) (*Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return NewConn(c, timeout), nil
}

// RemoteAddr is the peer's TCP address.
func (c *Conn) RemoteAddr() net.Addr { return c.c.RemoteAddr() }

// LocalAddr is this side's TCP address.
func (c *Conn) LocalAddr() net.Addr { return c.c.LocalAddr() }

// Send writes one message (its version is set here).
func (c *Conn) Send(m Message) error {
	m.V = Version
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(b))
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b)))
	_ = c.c.SetWriteDeadline(time.Now().Add(c.timeout))
	_, err = c.c.Write(append(frame, b...))
	return err
}

// Recv reads one message within timeout (0: the connection's). A message
// of type error comes back as an error with its text.
func (c *Conn) Recv(timeout time.Duration) (Message, error) {
	if timeout <= 0 {
		timeout = c.timeout
	}
	_ = c.c.SetReadDeadline(time.Now().Add(timeout))
	b, err := ReadFrame(c.r)
	if err != nil {
		return Message{}, err
	}
	m, err := Decode(b)
	if err != nil {
		return m, err
	}
	if m.Type == TypeError {
		return m, &RemoteError{Text: m.Error}
	}
	return m, nil
}

// Pending reports whether the other side sent something not read yet
// (a message, or the end of the connection), waiting at most wait for
// it. Nothing is consumed: Recv reads it.
func (c *Conn) Pending(wait time.Duration) bool {
	if c.r.Buffered() > 0 {
		return true
	}
	_ = c.c.SetReadDeadline(time.Now().Add(wait))
	_, err := c.r.Peek(1)
	var ne net.Error
	return err == nil || !(errors.As(err, &ne) && ne.Timeout())
}

// Expect reads a message and checks its type.
func (c *Conn) Expect(typ string, timeout time.Duration) (Message, error) {
	m, err := c.Recv(timeout)
	if err != nil {
		return m, err
	}
	if m.Type != typ {
		return m, fmt.Errorf("expected a %q message, got %q", typ, m.Type)
	}
	return m, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// CloseRead ends reading: a Recv blocked now, and every later one, fails
// at once with io.EOF, while Send still works (to tell the other side
// why). Connections without a read half to close are closed.
func (c *Conn) CloseRead() error {
	if cr, ok := c.c.(interface{ CloseRead() error }); ok {
		return cr.CloseRead()
	}
	return c.c.Close()
}

// RemoteError is an error the other side reported.
type RemoteError struct{ Text string }

func (e *RemoteError) Error() string { return "peer: " + e.Text }
