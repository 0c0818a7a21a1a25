package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	fw := NewFrameWriter(&buf)
	big := bytes.Repeat([]byte{0, 1, 2, 255}, DataChunk/2) // two data frames
	if err := fw.WriteJSON(&Request{Op: OpExec, Exec: &ExecRequest{ID: "ex_1", Argv: []string{"echo", "\x00bin"}}}); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteData(big); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteOutput(StreamStderr, 1<<40+3, []byte("err")); err != nil {
		t.Fatal(err)
	}
	if n, err := fw.ReadFrom(strings.NewReader("streamed")); err != nil || n != 8 {
		t.Fatalf("ReadFrom = %d, %v", n, err)
	}
	if err := fw.WriteEnd(); err != nil {
		t.Fatal(err)
	}

	fr := NewFrameReader(&buf)
	var req Request
	if err := fr.ReadJSON(&req); err != nil || req.Exec.Argv[1] != "\x00bin" || req.Op != OpExec {
		t.Fatalf("header %+v %v", req, err)
	}
	var data []byte
	for range 2 {
		typ, p, err := fr.Next()
		if err != nil || typ != FrameData {
			t.Fatalf("data frame %q %v", typ, err)
		}
		data = append(data, p...)
	}
	if !bytes.Equal(data, big) {
		t.Fatal("data differs")
	}
	typ, p, err := fr.Next()
	if err != nil || typ != FrameOutput {
		t.Fatalf("output frame %q %v", typ, err)
	}
	stream, off, out, err := DecodeOutput(p)
	if err != nil || stream != StreamStderr || off != 1<<40+3 || string(out) != "err" {
		t.Fatalf("output %q %d %q %v", stream, off, out, err)
	}
	if typ, p, err := fr.Next(); err != nil || typ != FrameData || string(p) != "streamed" {
		t.Fatalf("streamed frame %q %q %v", typ, p, err)
	}
	if typ, p, err := fr.Next(); err != nil || typ != FrameEnd || len(p) != 0 {
		t.Fatalf("end frame %q %v", typ, err)
	}
	if _, _, err := fr.Next(); err != io.EOF {
		t.Fatalf("after the last frame: %v", err)
	}
}

func TestFrameReaderErrors(t *testing.T) {
	huge := make([]byte, 5)
	huge[0] = byte(FrameData)
	binary.BigEndian.PutUint32(huge[1:], MaxFramePayload+1)
	tests := []struct {
		name  string
		input []byte
		want  error
	}{
		{"too_large", huge, ErrFrameTooLarge},
		{"truncated_header", []byte{'H', 0}, io.ErrUnexpectedEOF},
		{"truncated_payload", []byte{'D', 0, 0, 0, 9, 'a'}, io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := NewFrameReader(bytes.NewReader(tt.input)).Next()
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	t.Run("json_wants_header", func(t *testing.T) {
		var buf bytes.Buffer
		_ = NewFrameWriter(&buf).WriteEnd()
		var r Response
		if err := NewFrameReader(&buf).ReadJSON(&r); err == nil {
			t.Fatal("end frame decoded as JSON")
		}
	})
	t.Run("short_output", func(t *testing.T) {
		if _, _, _, err := DecodeOutput([]byte{'o', 1}); err == nil {
			t.Fatal("short output frame accepted")
		}
	})
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

type brokenReader struct{}

func (brokenReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }

func TestReadFromSourceError(t *testing.T) {
	_, err := NewFrameWriter(io.Discard).ReadFrom(brokenReader{})
	var se *SourceError
	if !errors.As(err, &se) || se.Err.Error() != "disk on fire" {
		t.Fatalf("err = %v, want a SourceError", err)
	}
}

func TestErrorText(t *testing.T) {
	e := &Error{Code: CodeNotFound, Message: "exec \"x\" not found"}
	if e.Error() != `not_found: exec "x" not found` {
		t.Fatal(e.Error())
	}
}

// trickleReader returns at most n bytes per Read, like a socket.
type trickleReader struct {
	r io.Reader
	n int
}

func (t *trickleReader) Read(p []byte) (int, error) { return t.r.Read(p[:min(len(p), t.n)]) }

func TestCopyFromFillsFrames(t *testing.T) {
	tests := []struct {
		name       string
		size       int
		chunk      int
		wantFrames []int
	}{
		{"empty", 0, 1000, nil},
		{"one_partial", 10, 1000, []int{10}},
		{"exact", 2000, 1000, []int{1000, 1000}},
		{"remainder", 2500, 1000, []int{1000, 1000, 500}},
		{"chunk_capped", DirectChunk + 3, 4 * DirectChunk, []int{DirectChunk, 3}},
		{"chunk_floor", 3, 0, []int{1, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := make([]byte, tt.size)
			for i := range data {
				data[i] = byte(i * 31)
			}
			var buf bytes.Buffer
			// Reads of 7 bytes at most: frames must still be full.
			n, err := NewFrameWriter(&buf).CopyFrom(&trickleReader{bytes.NewReader(data), 7}, tt.chunk)
			if err != nil || n != int64(tt.size) {
				t.Fatalf("CopyFrom = %d, %v", n, err)
			}
			fr := NewFrameReader(&buf)
			var got []int
			var back []byte
			for {
				typ, p, err := fr.Next()
				if err == io.EOF {
					break
				}
				if err != nil || typ != FrameData {
					t.Fatalf("frame %q %v", typ, err)
				}
				got = append(got, len(p))
				back = append(back, p...)
			}
			if !slices.Equal(got, tt.wantFrames) || !bytes.Equal(back, data) {
				t.Fatalf("frames %v, want %v (data equal: %v)", got, tt.wantFrames, bytes.Equal(back, data))
			}
		})
	}
	t.Run("source_unexpected_eof", func(t *testing.T) {
		// A truncated source (an HTTP body whose client left) must not
		// look like the end of the data.
		src := io.MultiReader(bytes.NewReader([]byte("abc")), errReader{io.ErrUnexpectedEOF})
		_, err := NewFrameWriter(io.Discard).CopyFrom(src, 1000)
		var se *SourceError
		if !errors.As(err, &se) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("err = %v, want the source's io.ErrUnexpectedEOF as a SourceError", err)
		}
	})
	t.Run("source_error", func(t *testing.T) {
		var buf bytes.Buffer
		src := io.MultiReader(bytes.NewReader([]byte("abc")), brokenReader{})
		n, err := NewFrameWriter(&buf).CopyFrom(src, 1000)
		var se *SourceError
		if !errors.As(err, &se) || se.Err.Error() != "disk on fire" || n != 3 {
			t.Fatalf("CopyFrom = %d, %v: want the 3 bytes read, then the SourceError", n, err)
		}
	})
}

func TestUnbufferedPayload(t *testing.T) {
	var buf bytes.Buffer
	fw := NewFrameWriter(&buf)
	if err := fw.WriteJSON(&Request{Op: OpReadFile}); err != nil {
		t.Fatal(err)
	}
	if err := fw.WriteHeader(FrameData, 5); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("hello")
	_ = fw.WriteEnd()
	buf.WriteString("trailing")
	if err := fw.WriteHeader(FrameData, MaxFramePayload+1); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized header: %v", err)
	}

	fr := NewFrameReaderUnbuffered(&buf)
	var req Request
	if err := fr.ReadJSON(&req); err != nil || req.Op != OpReadFile {
		t.Fatalf("header %+v %v", req, err)
	}
	typ, n, err := fr.NextHeader()
	if err != nil || typ != FrameData || n != 5 {
		t.Fatalf("NextHeader = %q %d %v", typ, n, err)
	}
	// The reader has not read ahead: the payload is still in the stream.
	if !strings.HasPrefix(buf.String(), "hello") {
		t.Fatalf("stream after the header: %q", buf.String())
	}
	p := fr.Payload(n)
	if p.R != io.Reader(&buf) {
		t.Fatal("Payload of an unbuffered reader must read the stream itself")
	}
	b, err := io.ReadAll(p)
	if err != nil || string(b) != "hello" {
		t.Fatalf("payload %q %v", b, err)
	}
	if typ, _, err := fr.Next(); err != nil || typ != FrameEnd {
		t.Fatalf("end %q %v", typ, err)
	}
	if buf.String() != "trailing" {
		t.Fatalf("read past the last frame: %q left", buf.String())
	}
}
