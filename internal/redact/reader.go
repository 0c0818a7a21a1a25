package redact

import "io"

// reader masks the sandbox's secrets in a file download, as exec
// output is masked: a file the sandbox wrote (or /run/secrets itself) must
// not carry a secret out through the files API. Masking keeps lengths, so
// a size already announced stays true. Bytes that could be the start of a
// secret continuing in the next read are held back until it is known (a
// read blocks, so no hold ever times out here).
type reader struct {
	r   *Redactor
	src io.ReadCloser
	st  streamState
	buf []byte // read buffer
	out []byte // final, not returned yet
	err error
}

// NewReader wraps rc; with no secrets it returns rc itself.
func NewReader(r *Redactor, rc io.ReadCloser) io.ReadCloser {
	if r.Empty() {
		return rc
	}
	return &reader{r: r, src: rc}
}

func (rr *reader) Read(p []byte) (int, error) {
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

func (rr *reader) Close() error { return rr.src.Close() }
