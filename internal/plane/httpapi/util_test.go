package httpapi_test

import "io"

var errEOF = io.EOF
