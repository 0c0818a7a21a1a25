package agentproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzFrameReader: whatever bytes come from the other end (the agent is
// inside the sandbox: hostile), the frame decoder ends with an error or
// EOF, never panics, and never holds more than one frame's bound.
func FuzzFrameReader(f *testing.F) {
	var b bytes.Buffer
	fw := NewFrameWriter(&b)
	fw.WriteJSON(&Response{Error: &Error{Code: CodeInvalidArgument, Message: "x"}})
	fw.WriteData([]byte("data"))
	fw.WriteOutput("stdout", 7, []byte("out"))
	fw.WriteEnd()
	f.Add(b.Bytes())
	f.Add([]byte{byte(FrameHeader), 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{byte(FrameOutput), 0, 0, 0, 3, 1, 2, 3})
	f.Add([]byte{byte(FrameHeader), 0, 0, 0, 4, '{', '"', 'a', ':'})
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, fr := range []*FrameReader{NewFrameReader(bytes.NewReader(in)), NewFrameReaderUnbuffered(bytes.NewReader(in))} {
			for i := 0; ; i++ {
				typ, p, err := fr.Next()
				if err != nil {
					if n := len(in); errors.Is(err, ErrFrameTooLarge) && n < frameHeaderLen {
						t.Fatalf("too large from %d bytes", n)
					}
					break
				}
				if len(p) > MaxFramePayload || cap(fr.buf) > MaxFramePayload {
					t.Fatalf("frame of %d bytes (buffer %d)", len(p), cap(fr.buf))
				}
				switch typ {
				case FrameHeader:
					var r Response
					_ = DecodeJSON(p, &r)
				case FrameOutput:
					if s, _, d, err := DecodeOutput(p); err == nil && (len(d) != len(p)-9 || s == "") {
						t.Fatalf("output frame split wrong: %q %d of %d", s, len(d), len(p))
					}
				}
			}
		}
		// The streaming path: headers and payloads read apart.
		fr := NewFrameReaderUnbuffered(bytes.NewReader(in))
		for {
			_, n, err := fr.NextHeader()
			if err != nil {
				break
			}
			if k, _ := io.Copy(io.Discard, fr.Payload(n)); k > int64(n) {
				t.Fatalf("payload read %d past its %d", k, n)
			}
		}
	})
}
