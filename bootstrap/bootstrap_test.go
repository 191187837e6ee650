package bootstrap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fitransfer/fitransfer/transport"
)

func pair(t *testing.T) (*Conn, *Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return NewConn(a, time.Second), NewConn(b, time.Second)
}

func TestRoundTrip(t *testing.T) {
	a, b := pair(t)
	want := Message{Type: TypeHello, Mode: ModeWrite, Seed: 7, Size: 4096, Handle: []byte{1, 2, 3},
		Address: &transport.Address{Endpoints: []transport.AddressEndpoint{{Provider: "shm", Name: []byte("x")}}}}
	go func() { _ = a.Send(want) }()
	got, err := b.Expect(TypeHello, 0)
	require.NoError(t, err)
	want.V = Version
	assert.Equal(t, want, got)
}

func TestErrorsAndDeadlines(t *testing.T) {
	a, b := pair(t)
	go func() { _ = a.Send(Message{Type: TypeError, Error: "no room"}) }()
	_, err := b.Recv(0)
	var re *RemoteError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "peer: no room", err.Error())

	start := time.Now()
	_, err = b.Recv(50 * time.Millisecond)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	assert.True(t, ne.Timeout())
	assert.Less(t, time.Since(start), time.Second)

	go func() { _ = a.Send(Message{Type: TypeBye}) }()
	_, err = b.Expect(TypeWelcome, 0)
	assert.ErrorContains(t, err, `expected a "welcome" message, got "bye"`)
}

func frame(payload []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(payload))), payload...)
}

func TestBadFrames(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want error
		text string
	}{
		{"empty", nil, io.EOF, ""},
		{"short header", []byte{0, 0}, io.ErrUnexpectedEOF, ""},
		{"too large", []byte{0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge, "not a fitransfer peer"},
		{"truncated payload", []byte{0, 0, 0, 10, '{'}, io.ErrUnexpectedEOF, ""},
		{"http", []byte("GET / HTTP/1.1\r\n\r\n"), ErrFrameTooLarge, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.in))
			assert.True(t, errors.Is(err, tt.want), "%v", err)
			if tt.text != "" {
				assert.ErrorContains(t, err, tt.text)
			}
		})
	}
	_, err := Decode([]byte(`{"v":2,"type":"hello"}`))
	var ve *VersionError
	require.ErrorAs(t, err, &ve)
	assert.Contains(t, err.Error(), "protocol version 2; this fitransfer speaks version 1")
	_, err = Decode([]byte(`garbage`))
	assert.ErrorContains(t, err, "not a fitransfer message")
	_, err = Decode([]byte(`{"v":1}`))
	assert.ErrorContains(t, err, "without a type")
}

func FuzzReadMessage(f *testing.F) {
	f.Add(frame([]byte(`{"v":1,"type":"hello","mode":"read","seed":1}`)))
	f.Add(frame([]byte(`{"v":2,"type":"hello"}`)))
	f.Add(frame([]byte(`{"v":1,"type":"welcome","handle":"RlRSQgE="}`)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 3, 'a', 'b'})
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ReadFrame(bytes.NewReader(data))
		if err != nil {
			return
		}
		if len(b) > MaxFrame {
			t.Fatalf("frame of %d bytes accepted", len(b))
		}
		m, err := Decode(b)
		if err == nil && m.V != Version {
			t.Fatalf("accepted version %d", m.V)
		}
	})
}
