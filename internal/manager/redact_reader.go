package manager

import "io"

// redactingReader masks the sandbox's secrets in a file download, as exec
// output is masked: a file the sandbox wrote (or /run/secrets itself) must
// not carry a secret out through the files API. Masking keeps lengths, so
// a size already announced stays true. Bytes that could be the start of a
// secret continuing in the next read are held back until it is known.
type redactingReader struct {
	r   *redactor
	src io.ReadCloser
	buf []byte // read, not yet returned; buf[:ready] is final
	// ready is how many leading bytes of buf are masked and cannot change.
	ready int
	err   error
}

// newRedactingReader wraps rc; with no secrets it returns rc itself.
func newRedactingReader(r *redactor, rc io.ReadCloser) io.ReadCloser {
	if r.empty() {
		return rc
	}
	return &redactingReader{r: r, src: rc}
}

func (rr *redactingReader) Read(p []byte) (int, error) {
	for rr.ready == 0 {
		if rr.err != nil {
			if len(rr.buf) > 0 {
				// End of input: what was held back cannot grow into a
				// secret any more.
				rr.ready = len(rr.buf)
				break
			}
			return 0, rr.err
		}
		chunk := make([]byte, 32<<10)
		n, err := rr.src.Read(chunk)
		rr.buf = append(rr.buf, chunk[:n]...)
		rr.err = err
		if n == 0 && err == nil {
			continue
		}
		rr.r.mask(rr.buf)
		if err == nil {
			rr.ready = len(rr.buf) - rr.r.holdback(rr.buf)
		}
	}
	n := copy(p, rr.buf[:rr.ready])
	rr.buf = rr.buf[n:]
	rr.ready -= n
	if len(rr.buf) == 0 {
		rr.buf = nil
	}
	return n, nil
}

func (rr *redactingReader) Close() error { return rr.src.Close() }
