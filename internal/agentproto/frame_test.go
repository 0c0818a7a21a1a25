package agentproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
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
