package agentproto

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
)

// FrameType is the first byte of every frame.
//
// A frame is: type (1 byte), payload length (4 bytes, big endian), payload.
type FrameType byte

// Frame types.
const (
	// FrameHeader carries one JSON value: a Request, a Response or an Event.
	FrameHeader FrameType = 'H'
	// FrameData carries raw bytes (file contents, tar streams, stdin).
	FrameData FrameType = 'D'
	// FrameEnd marks the end of a sequence of data frames; no payload.
	FrameEnd FrameType = 'E'
	// FrameOutput carries exec output without JSON: the stream (1 byte: 'o'
	// stdout, 'e' stderr, 'p' pty), the offset (8 bytes, big endian), data.
	FrameOutput FrameType = 'O'
)

const frameHeaderLen = 5

// MaxFramePayload bounds one frame's payload. It protects both sides from a
// peer that announces a huge length; writers use DataChunk-sized frames.
const MaxFramePayload = 4 << 20

// DataChunk is the size of the data frames writers send: large enough that
// per-frame overhead vanishes against copying, small enough to interleave
// streams fairly on the shared connection.
const DataChunk = 256 << 10

// ErrFrameTooLarge is returned for a frame longer than MaxFramePayload.
var ErrFrameTooLarge = errors.New("frame too large")

// FrameWriter writes frames to a stream. It is not safe for concurrent use.
type FrameWriter struct {
	w   io.Writer
	buf []byte
}

// NewFrameWriter returns a FrameWriter on w.
func NewFrameWriter(w io.Writer) *FrameWriter { return &FrameWriter{w: w} }

func (fw *FrameWriter) grow(n int) []byte {
	if cap(fw.buf) < n {
		fw.buf = make([]byte, n)
	}
	return fw.buf[:n]
}

// WriteJSON writes a header frame holding v.
func (fw *FrameWriter) WriteJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding header: %w", err)
	}
	if len(b) > MaxFramePayload {
		return ErrFrameTooLarge
	}
	buf := fw.grow(frameHeaderLen + len(b))
	buf[0] = byte(FrameHeader)
	binary.BigEndian.PutUint32(buf[1:], uint32(len(b)))
	copy(buf[frameHeaderLen:], b)
	_, err = fw.w.Write(buf)
	return err
}

// WriteData writes p as data frames.
func (fw *FrameWriter) WriteData(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), DataChunk)
		buf := fw.grow(frameHeaderLen + n)
		buf[0] = byte(FrameData)
		binary.BigEndian.PutUint32(buf[1:], uint32(n))
		copy(buf[frameHeaderLen:], p[:n])
		if _, err := fw.w.Write(buf); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// ReadFrom copies r into data frames until r returns io.EOF, reading straight
// into the frame buffer. It does not write an end frame. It returns the bytes
// copied and the first error of r (as ErrSource) or of the stream.
func (fw *FrameWriter) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	buf := fw.grow(frameHeaderLen + DataChunk)
	for {
		n, rerr := r.Read(buf[frameHeaderLen:])
		if n > 0 {
			buf[0] = byte(FrameData)
			binary.BigEndian.PutUint32(buf[1:], uint32(n))
			if _, err := fw.w.Write(buf[:frameHeaderLen+n]); err != nil {
				return total, err
			}
			total += int64(n)
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, &SourceError{Err: rerr}
		}
	}
}

// chunkBufs recycles CopyFrom's frame buffers: a direct upload needs one of
// DirectChunk, and most uploads are far smaller than the buffer.
var chunkBufs = sync.Pool{New: func() any { b := make([]byte, frameHeaderLen+DirectChunk); return &b }}

// CopyFrom is ReadFrom for bulk transfers: it fills each data frame up to
// chunk bytes (at most DirectChunk) before sending it, so a source that
// returns small reads (a socket) still makes few, large frames. A partial
// frame waits for more input, so it suits uploads, not interactive streams.
func (fw *FrameWriter) CopyFrom(r io.Reader, chunk int) (int64, error) {
	chunk = min(max(chunk, 1), DirectChunk)
	bp := chunkBufs.Get().(*[]byte)
	defer chunkBufs.Put(bp)
	buf := (*bp)[:frameHeaderLen+chunk]
	var total int64
	for {
		// Not io.ReadFull: it turns a source's own io.ErrUnexpectedEOF (an
		// HTTP body whose client left half way) into a clean end.
		n := frameHeaderLen
		var rerr error
		for n < len(buf) && rerr == nil {
			var k int
			k, rerr = r.Read(buf[n:])
			n += k
		}
		if n -= frameHeaderLen; n > 0 {
			buf[0] = byte(FrameData)
			binary.BigEndian.PutUint32(buf[1:], uint32(n))
			if _, err := fw.w.Write(buf[:frameHeaderLen+n]); err != nil {
				return total, err
			}
			total += int64(n)
		}
		switch rerr {
		case nil:
		case io.EOF:
			return total, nil
		default:
			return total, &SourceError{Err: rerr}
		}
	}
}

// SocketBody is an upload source of a known length whose bytes are still in
// a socket: Head (what the socket's owner already read ahead), then exactly
// N more bytes from Conn. A writer that knows it (agentclient, on a direct
// connection) moves the Conn part by splice(2) and advances N and Consumed
// by Advance; Read serves every other. A Conn that ends before N bytes gives
// io.ErrUnexpectedEOF.
type SocketBody struct {
	Head []byte
	Conn net.Conn
	N    int64

	consumed int64
}

// Read implements io.Reader.
func (sb *SocketBody) Read(p []byte) (int, error) {
	if len(sb.Head) > 0 {
		n := copy(p, sb.Head)
		sb.Head = sb.Head[n:]
		sb.consumed += int64(n)
		return n, nil
	}
	if sb.N <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > sb.N {
		p = p[:sb.N]
	}
	n, err := sb.Conn.Read(p)
	sb.N -= int64(n)
	sb.consumed += int64(n)
	if err == io.EOF {
		if sb.N > 0 {
			return n, io.ErrUnexpectedEOF
		}
		if n > 0 {
			err = nil
		}
	}
	return n, err
}

// Consumed returns how many bytes of the body were taken so far.
func (sb *SocketBody) Consumed() int64 { return sb.consumed }

// TakeHead returns Head, counted as consumed, and clears it.
func (sb *SocketBody) TakeHead() []byte {
	h := sb.Head
	sb.Head = nil
	sb.consumed += int64(len(h))
	return h
}

// Advance records that n bytes were taken from Conn without Read.
func (sb *SocketBody) Advance(n int64) {
	sb.N -= n
	sb.consumed += n
}

// WriteHeader writes only the header of a frame of type t with an n-byte
// payload. The caller then writes exactly n bytes to the stream itself, e.g.
// by sendfile(2) from a file.
func (fw *FrameWriter) WriteHeader(t FrameType, n int) error {
	if n < 0 || n > MaxFramePayload {
		return ErrFrameTooLarge
	}
	var hdr [frameHeaderLen]byte
	hdr[0] = byte(t)
	binary.BigEndian.PutUint32(hdr[1:], uint32(n))
	_, err := fw.w.Write(hdr[:])
	return err
}

// SourceError wraps an error of the reader given to FrameWriter.ReadFrom, so
// callers can tell it from a failure of the stream.
type SourceError struct{ Err error }

// Error implements error.
func (e *SourceError) Error() string { return "reading source: " + e.Err.Error() }

// Unwrap returns the reader's error.
func (e *SourceError) Unwrap() error { return e.Err }

// WriteEnd writes an end frame.
func (fw *FrameWriter) WriteEnd() error {
	buf := fw.grow(frameHeaderLen)
	buf[0] = byte(FrameEnd)
	binary.BigEndian.PutUint32(buf[1:], 0)
	_, err := fw.w.Write(buf)
	return err
}

// WriteOutput writes an output frame.
func (fw *FrameWriter) WriteOutput(stream string, offset int64, data []byte) error {
	const pre = 9
	buf := fw.grow(frameHeaderLen + pre + len(data))
	buf[0] = byte(FrameOutput)
	binary.BigEndian.PutUint32(buf[1:], uint32(pre+len(data)))
	buf[frameHeaderLen] = streamByte(stream)
	binary.BigEndian.PutUint64(buf[frameHeaderLen+1:], uint64(offset))
	copy(buf[frameHeaderLen+pre:], data)
	_, err := fw.w.Write(buf)
	return err
}

func streamByte(s string) byte {
	switch s {
	case StreamStderr:
		return 'e'
	case StreamPTY:
		return 'p'
	default:
		return 'o'
	}
}

func streamName(b byte) string {
	switch b {
	case 'e':
		return StreamStderr
	case 'p':
		return StreamPTY
	default:
		return StreamStdout
	}
}

// FrameReader reads frames from a stream. It is not safe for concurrent use.
type FrameReader struct {
	r   io.Reader // a bufio.Reader, or the stream itself when unbuffered
	hdr [frameHeaderLen]byte
	buf []byte
}

// NewFrameReader returns a FrameReader on r.
func NewFrameReader(r io.Reader) *FrameReader {
	return &FrameReader{r: bufio.NewReaderSize(r, 4<<10)}
}

// NewFrameReaderUnbuffered returns a FrameReader that never reads ahead of
// the current frame: after NextHeader, the payload is still in r, where the
// kernel can move it (Payload). For direct connections, whose frames are
// large enough that two reads per frame cost nothing.
func NewFrameReaderUnbuffered(r io.Reader) *FrameReader {
	return &FrameReader{r: r}
}

// NextHeader reads the next frame's header and returns its type and payload
// length, leaving the payload unread: the caller must consume exactly n bytes
// through Payload before reading another frame. End of stream is as in Next.
func (fr *FrameReader) NextHeader() (FrameType, int, error) {
	if _, err := io.ReadFull(fr.r, fr.hdr[:]); err != nil {
		return 0, 0, err
	}
	n := binary.BigEndian.Uint32(fr.hdr[1:])
	if n > MaxFramePayload {
		return 0, 0, ErrFrameTooLarge
	}
	return FrameType(fr.hdr[0]), int(n), nil
}

// Payload returns a reader of the next n payload bytes (n from NextHeader).
// On an unbuffered FrameReader it reads the stream itself, so that an
// *os.File or *net.TCPConn given it to ReadFrom can splice it.
func (fr *FrameReader) Payload(n int) *io.LimitedReader {
	return &io.LimitedReader{R: fr.r, N: int64(n)}
}

// Next reads the next frame. The payload is valid until the next call.
// A stream that ends cleanly between frames gives io.EOF; one that ends inside
// a frame gives io.ErrUnexpectedEOF.
func (fr *FrameReader) Next() (FrameType, []byte, error) {
	t, n, err := fr.NextHeader()
	if err != nil {
		return 0, nil, err
	}
	if cap(fr.buf) < n {
		fr.buf = make([]byte, n)
	}
	p := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, p); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return t, p, nil
}

// ReadJSON reads a frame that must be a header frame and decodes it into v.
func (fr *FrameReader) ReadJSON(v any) error {
	t, p, err := fr.Next()
	if err != nil {
		return err
	}
	if t != FrameHeader {
		return fmt.Errorf("want header frame, got %q", byte(t))
	}
	return DecodeJSON(p, v)
}

// DecodeJSON decodes a header frame's payload into v.
func DecodeJSON(p []byte, v any) error {
	if err := json.Unmarshal(p, v); err != nil {
		return fmt.Errorf("decoding header: %w", err)
	}
	return nil
}

// DecodeOutput splits an output frame's payload. data aliases p.
func DecodeOutput(p []byte) (stream string, offset int64, data []byte, err error) {
	if len(p) < 9 {
		return "", 0, nil, errors.New("short output frame")
	}
	return streamName(p[0]), int64(binary.BigEndian.Uint64(p[1:9])), p[9:], nil
}
