package transport

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/fitransfer/fitransfer/internal/errclass"
	"github.com/fitransfer/fitransfer/internal/route/libfabric"
	"github.com/fitransfer/fitransfer/mr"
)

// The binary handle format, version 2 (docs/handle.md): version 1 and a
// rail number per endpoint. Integers are little-endian; the CRC-32C of
// everything before it ends the handle.
const (
	handleMagic      = "FTRB"
	handleVersion    = 2
	maxRails         = 32 // p5 has 32 NICs
	maxHandleEPs     = 8 + maxRails
	maxProviderLen   = 64
	maxEPNameLen     = libfabric.MaxNameLen
	handleHeaderSize = 4 + 1 + 1 + 1 + 1 + 16 + 16 + 8 + 8 + 8 + 8
	// MaxHandleSize bounds an encoded handle.
	MaxHandleSize = handleHeaderSize + maxHandleEPs*(1+maxProviderLen+1+2+maxEPNameLen+8+8+1+8+8+4+8) + 4
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// ErrBadHandle is wrapped by every error decoding a handle.
var ErrBadHandle = errclass.ErrBadHandle

func badHandle(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadHandle, fmt.Sprintf(format, args...))
}

// MarshalBinary encodes the handle (format version 2, docs/handle.md).
func (r RemoteBuffer) MarshalBinary() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 128)
	b = append(b, handleMagic...)
	b = append(b, handleVersion, 0, byte(r.access), byte(len(r.eps)))
	b = append(b, r.node[:]...)
	b = append(b, r.owner[:]...)
	b = binary.LittleEndian.AppendUint64(b, r.id)
	b = binary.LittleEndian.AppendUint64(b, r.off)
	b = binary.LittleEndian.AppendUint64(b, r.n)
	b = binary.LittleEndian.AppendUint64(b, r.size)
	for _, ep := range r.eps {
		b = append(b, byte(len(ep.provider)))
		b = append(b, ep.provider...)
		b = append(b, ep.rail)
		b = binary.LittleEndian.AppendUint16(b, uint16(len(ep.name)))
		b = append(b, ep.name...)
		b = binary.LittleEndian.AppendUint64(b, ep.key)
		b = binary.LittleEndian.AppendUint64(b, ep.base)
		if ep.guard == nil {
			b = append(b, 0)
			continue
		}
		b = append(b, 1)
		b = binary.LittleEndian.AppendUint64(b, ep.guard.table)
		b = binary.LittleEndian.AppendUint64(b, ep.guard.key)
		b = binary.LittleEndian.AppendUint32(b, ep.guard.slot)
		b = binary.LittleEndian.AppendUint64(b, ep.guard.gen)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, crcTable)), nil
}

// UnmarshalBinary decodes a handle, of format version 2 or 1 (no rails).
// Any malformed, truncated or corrupted input, or an unknown version, is
// an error wrapping ErrBadHandle.
func (r *RemoteBuffer) UnmarshalBinary(data []byte) error {
	if len(data) > MaxHandleSize {
		return badHandle("%d bytes, more than the %d a handle can have", len(data), MaxHandleSize)
	}
	if len(data) < handleHeaderSize+4 {
		return badHandle("%d bytes, too short (truncated?)", len(data))
	}
	if string(data[:4]) != handleMagic {
		return badHandle("does not start with %q", handleMagic)
	}
	v := data[4]
	if v != handleVersion && v != 1 {
		return badHandle("format version %d; this fitransfer reads versions 1 and %d (upgrade the older side)", v, handleVersion)
	}
	body, sum := data[:len(data)-4], binary.LittleEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return badHandle("checksum mismatch: the handle was truncated or altered in transit")
	}
	d := decoder{b: body[5:]}
	var out RemoteBuffer
	if d.u8() != 0 {
		return badHandle("unknown flags")
	}
	out.access = mr.Access(d.u8())
	n := int(d.u8())
	copy(out.node[:], d.bytes(16))
	copy(out.owner[:], d.bytes(16))
	out.id, out.off, out.n, out.size = d.u64(), d.u64(), d.u64(), d.u64()
	if n > maxHandleEPs {
		return badHandle("%d endpoints, at most %d", n, maxHandleEPs)
	}
	for i := 0; i < n && d.err == nil; i++ {
		var ep remoteEP
		ep.provider = string(d.bytes(int(d.u8())))
		if v >= 2 {
			ep.rail = d.u8()
		}
		ep.name = append([]byte(nil), d.bytes(int(d.u16()))...)
		ep.key, ep.base = d.u64(), d.u64()
		switch d.u8() {
		case 0:
		case 1:
			ep.guard = &guardRef{table: d.u64(), key: d.u64(), slot: d.u32(), gen: d.u64()}
		default:
			return badHandle("endpoint %d: bad guard flag", i)
		}
		out.eps = append(out.eps, ep)
	}
	if d.err != nil {
		return badHandle("truncated")
	}
	if len(d.b) != 0 {
		return badHandle("%d unexpected bytes at the end", len(d.b))
	}
	if err := out.check(); err != nil {
		return err
	}
	*r = out
	return nil
}

// check validates the fields of a handle.
func (r RemoteBuffer) check() error {
	switch {
	case len(r.eps) == 0:
		return badHandle("no endpoint")
	case len(r.eps) > maxHandleEPs:
		return badHandle("%d endpoints, at most %d", len(r.eps), maxHandleEPs)
	case r.access&^mr.ReadWrite != 0:
		return badHandle("unknown access bits %#x", uint8(r.access))
	case r.off > r.size || r.n > r.size-r.off:
		return badHandle("range [%d, %d) outside the %d-byte buffer", r.off, r.off+r.n, r.size)
	}
	type place struct {
		provider string
		rail     uint8
	}
	seen := map[place]bool{}
	for i, ep := range r.eps {
		switch {
		case ep.provider == "" || len(ep.provider) > maxProviderLen:
			return badHandle("endpoint %d: provider name of %d bytes", i, len(ep.provider))
		case ep.rail >= maxRails:
			return badHandle("endpoint %d: rail %d, at most %d rails", i, ep.rail, maxRails)
		case seen[place{ep.provider, ep.rail}]:
			return badHandle("provider %q rail %d listed twice", ep.provider, ep.rail)
		case len(ep.name) == 0 || len(ep.name) > maxEPNameLen:
			return badHandle("endpoint %d: address of %d bytes", i, len(ep.name))
		case ep.base+r.size < ep.base:
			return badHandle("endpoint %d: address range overflows", i)
		}
		seen[place{ep.provider, ep.rail}] = true
	}
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.err = errors.New("short")
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) u8() uint8 {
	b := d.bytes(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (d *decoder) u16() uint16 {
	b := d.bytes(2)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}

func (d *decoder) u32() uint32 {
	b := d.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}

func (d *decoder) u64() uint64 {
	b := d.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// jsonVersion is the JSON form's version: 3 adds each endpoint's rail;
// 2 wrote 64-bit fields as decimal strings. Version 1 wrote them as JSON
// numbers, which a generic decoder (into float64) silently rounds above
// 2^53 — a key or address then names other memory. Versions 1 and 2
// still decode (every endpoint on rail 0).
const jsonVersion = 3

// handleJSON is the JSON form: the same fields, by name.
type handleJSON struct {
	Version   int      `json:"version"`
	Node      string   `json:"node"`
	Owner     string   `json:"owner"`
	ID        u64      `json:"id"`
	Offset    u64      `json:"offset"`
	Length    u64      `json:"length"`
	Size      u64      `json:"size"`
	Access    []string `json:"access"`
	Endpoints []epJSON `json:"endpoints"`
}

type epJSON struct {
	Provider string     `json:"provider"`
	Rail     uint8      `json:"rail,omitempty"`
	Name     string     `json:"name"` // base64
	Key      u64        `json:"key"`
	Addr     u64        `json:"addr"`
	Guard    *guardJSON `json:"guard,omitempty"`
}

type guardJSON struct {
	Table u64    `json:"table"`
	Key   u64    `json:"key"`
	Slot  uint32 `json:"slot"`
	Gen   u64    `json:"gen"`
}

// u64 is a 64-bit field of the JSON form: written as a decimal string,
// read from a string or (version 1) a number.
type u64 uint64

// MarshalJSON writes the decimal string.
func (v u64) MarshalJSON() ([]byte, error) {
	return strconv.AppendQuote(nil, strconv.FormatUint(uint64(v), 10)), nil
}

// UnmarshalJSON reads a decimal string, or an integer number.
func (v *u64) UnmarshalJSON(b []byte) error {
	s := string(b)
	if len(s) >= 2 && s[0] == '"' {
		var err error
		if s, err = strconv.Unquote(s); err != nil {
			return err
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return fmt.Errorf("want an unsigned 64-bit integer as a decimal string, got %s", b)
	}
	*v = u64(n)
	return nil
}

// MarshalJSON encodes the handle as JSON (docs/handle.md).
func (r RemoteBuffer) MarshalJSON() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	h := handleJSON{Version: jsonVersion, Node: r.node.String(), Owner: r.owner.String(),
		ID: u64(r.id), Offset: u64(r.off), Length: u64(r.n), Size: u64(r.size), Access: []string{}}
	if r.access&mr.RemoteRead != 0 {
		h.Access = append(h.Access, "remote_read")
	}
	if r.access&mr.RemoteWrite != 0 {
		h.Access = append(h.Access, "remote_write")
	}
	for _, ep := range r.eps {
		e := epJSON{Provider: ep.provider, Rail: ep.rail, Name: base64.StdEncoding.EncodeToString(ep.name), Key: u64(ep.key), Addr: u64(ep.base)}
		if g := ep.guard; g != nil {
			e.Guard = &guardJSON{Table: u64(g.table), Key: u64(g.key), Slot: g.slot, Gen: u64(g.gen)}
		}
		h.Endpoints = append(h.Endpoints, e)
	}
	return json.Marshal(h)
}

// UnmarshalJSON decodes the JSON form; errors wrap ErrBadHandle.
func (r *RemoteBuffer) UnmarshalJSON(data []byte) error {
	var h handleJSON
	if err := json.Unmarshal(data, &h); err != nil {
		return badHandle("JSON: %v", err)
	}
	if h.Version < 1 || h.Version > jsonVersion {
		return badHandle("JSON format version %d; this fitransfer reads versions 1 to %d (upgrade the older side)", h.Version, jsonVersion)
	}
	var out RemoteBuffer
	if err := parseID(h.Node, &out.node); err != nil {
		return badHandle("node: %v", err)
	}
	if err := parseID(h.Owner, &out.owner); err != nil {
		return badHandle("owner: %v", err)
	}
	out.id, out.off, out.n, out.size = uint64(h.ID), uint64(h.Offset), uint64(h.Length), uint64(h.Size)
	for _, a := range h.Access {
		switch a {
		case "remote_read":
			out.access |= mr.RemoteRead
		case "remote_write":
			out.access |= mr.RemoteWrite
		default:
			return badHandle("unknown access %q", a)
		}
	}
	if len(h.Endpoints) > maxHandleEPs {
		return badHandle("%d endpoints, at most %d", len(h.Endpoints), maxHandleEPs)
	}
	for i, e := range h.Endpoints {
		name, err := base64.StdEncoding.DecodeString(e.Name)
		if err != nil {
			return badHandle("endpoint %d: name: %v", i, err)
		}
		if h.Version < 3 && e.Rail != 0 {
			return badHandle("endpoint %d: a rail in a version %d handle", i, h.Version)
		}
		ep := remoteEP{provider: e.Provider, rail: e.Rail, name: name, key: uint64(e.Key), base: uint64(e.Addr)}
		if g := e.Guard; g != nil {
			ep.guard = &guardRef{table: uint64(g.Table), key: uint64(g.Key), slot: g.Slot, gen: uint64(g.Gen)}
		}
		out.eps = append(out.eps, ep)
	}
	if err := out.check(); err != nil {
		return err
	}
	*r = out
	return nil
}

func parseID(s string, id *ID) error {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(id) {
		return fmt.Errorf("want %d hex bytes, got %q", len(id), s)
	}
	copy(id[:], b)
	return nil
}
