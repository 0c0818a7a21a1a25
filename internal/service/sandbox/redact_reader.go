package sandbox

import "io"

// redactingReader masks the sandbox's secrets in a file download, as exec
// output is masked: a file the sandbox wrote (or /run/secrets itself) must
// not carry a secret out through the files API. Masking keeps lengths, so
// a size already announced stays true. Bytes that could be the start of a
// secret continuing in the next read are held back until it is known (a
// read blocks, so no hold ever times out here).
type redactingReader struct {
	r   *redactor
	src io.ReadCloser
	st  streamState
	buf []byte // read buffer
	out []byte // final, not returned yet
	err error
}

// newRedactingReader wraps rc; with no secrets it returns rc itself.
func newRedactingReader(r *redactor, rc io.ReadCloser) io.ReadCloser {
	if r.empty() {
		return rc
	}
	return &redactingReader{r: r, src: rc}
}

func (rr *redactingReader) Read(p []byte) (int, error) {
	for len(rr.out) == 0 {
		if rr.err != nil {
			if len(rr.st.held) == 0 {
				return 0, rr.err
			}
			// End of input: what was held back cannot grow into a
			// secret any more.
			rr.out = rr.st.heldText()
			rr.st.end()
			break
		}
		if rr.buf == nil {
			rr.buf = make([]byte, 32<<10)
		}
		n, err := rr.src.Read(rr.buf)
		rr.err = err
		if n > 0 {
			region, hold := rr.st.feed(rr.r, rr.buf[:n], 0, false, nil)
			rr.out = region[:len(region)-hold]
		}
	}
	n := copy(p, rr.out)
	rr.out = rr.out[n:]
	return n, nil
}

func (rr *redactingReader) Close() error { return rr.src.Close() }
