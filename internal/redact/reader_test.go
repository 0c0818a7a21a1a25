package redact

import (
	"bytes"
	"encoding/base64"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func TestRedactingReader(t *testing.T) {
	const secret = "s3cr3t-VALUE-42"
	r := New(map[string]string{"TOKEN": secret})
	stars := strings.Repeat("*", len(secret))
	b64 := base64.StdEncoding.EncodeToString([]byte(secret))
	tests := []struct {
		name, in, want string
		oneByte        bool
	}{
		{name: "plain", in: "a " + secret + " b", want: "a " + stars + " b"},
		{name: "split_across_reads", in: "xx" + secret + secret + "yy", want: "xx" + stars + stars + "yy", oneByte: true},
		{name: "base64", in: "k=" + b64, want: "k=" + strings.Repeat("*", len(b64))},
		{name: "prefix_at_end_is_kept", in: "tail " + secret[:5], want: "tail " + secret[:5], oneByte: true},
		{name: "no_secret", in: "nothing to see", want: "nothing to see", oneByte: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var src io.Reader = strings.NewReader(tc.in)
			if tc.oneByte {
				src = iotest.OneByteReader(src)
			}
			got, err := io.ReadAll(NewReader(r, io.NopCloser(src)))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRedactingReaderWithoutSecretsIsTheSource(t *testing.T) {
	src := io.NopCloser(bytes.NewReader([]byte("x")))
	if got := NewReader(New(nil), src); got != src {
		t.Fatalf("want the source itself when there is nothing to redact, got %T", got)
	}
}
