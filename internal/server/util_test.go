package server_test

import "io"

var errEOF = io.EOF
