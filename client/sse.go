package client

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
	"strings"
	"sync"
)

// maxSSELine bounds one line of an event stream. The server sends output in
// chunks far below this (base64 of a 64 KiB read is 88 KiB); a longer line
// means a broken or hostile peer, and buffering it would cost unbounded memory.
const maxSSELine = 8 << 20

var errSSELineTooLong = errors.New("event stream line too long")

// sseEvent is one dispatched Server-Sent Event.
type sseEvent struct {
	Event string
	Data  string
	ID    string
}

// sseReader parses text/event-stream (WHATWG HTML, "server-sent events").
type sseReader struct {
	br *bufio.Reader
	// touch is called for every line read, heartbeats included, so an idle
	// watchdog can tell a silent connection from a quiet exec.
	touch func()
}

// sseBufs recycles the readers' buffers: an exec stream is short, and a
// fresh 64 KiB buffer for each was most of what a command's round trip
// allocated.
var sseBufs = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

func newSSEReader(r io.Reader, touch func()) *sseReader {
	if touch == nil {
		touch = func() {}
	}
	br := sseBufs.Get().(*bufio.Reader)
	br.Reset(r)
	return &sseReader{br: br, touch: touch}
}

// release gives the reader's buffer back; the reader is not used after.
func (r *sseReader) release() {
	r.br.Reset(nil)
	sseBufs.Put(r.br)
	r.br = nil
}

// next returns the next event with data. Comments (heartbeats) and events
// without a data field are skipped. At the end of the stream it returns
// io.EOF, or io.ErrUnexpectedEOF when the stream stopped inside an event.
func (r *sseReader) next() (sseEvent, error) {
	var (
		ev      sseEvent
		data    strings.Builder
		hasData bool
		partial bool
	)
	for {
		line, err := r.readLine()
		if err != nil {
			if err == io.EOF && partial {
				return sseEvent{}, io.ErrUnexpectedEOF
			}
			return sseEvent{}, err
		}
		r.touch()
		if line == "" {
			if hasData {
				ev.Data = data.String()
				return ev, nil
			}
			ev, partial = sseEvent{}, false
			continue
		}
		if line[0] == ':' {
			continue // comment: a heartbeat
		}
		partial = true
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			ev.Event = value
		case "data":
			if hasData {
				data.WriteByte('\n')
			}
			data.WriteString(value)
			hasData = true
		case "id":
			ev.ID = value
		}
	}
}

// readLine returns one line without its terminator (\n or \r\n).
func (r *sseReader) readLine() (string, error) {
	var buf []byte
	for {
		chunk, err := r.br.ReadSlice('\n')
		if len(buf)+len(chunk) > maxSSELine {
			return "", errSSELineTooLong
		}
		if err == bufio.ErrBufferFull {
			buf = append(buf, chunk...)
			continue
		}
		if err != nil {
			if err == io.EOF && (len(buf)+len(chunk)) > 0 {
				// A line cut off by the end of the stream is not a line.
				return "", io.ErrUnexpectedEOF
			}
			return "", err
		}
		if buf == nil {
			chunk = bytes.TrimSuffix(chunk[:len(chunk)-1], []byte{'\r'})
			return string(chunk), nil
		}
		buf = append(buf, chunk...)
		return string(bytes.TrimSuffix(buf[:len(buf)-1], []byte{'\r'})), nil
	}
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "text/event-stream"
}
