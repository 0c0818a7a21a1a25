package mcp

import (
	"testing"

	"go.uber.org/goleak"
)

// The sessions, their transports and the HTTP servers of a test end with
// it: nothing keeps running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
