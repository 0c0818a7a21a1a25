package escape

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if agentDir != "" {
			os.RemoveAll(agentDir) // the suite's agent build
		}
		os.Exit(code)
	}))
}
