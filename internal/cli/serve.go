package cli

import (
	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/daemon"
)

// newServeCmd returns `airlock serve`, which internal/daemon implements.
func newServeCmd() *cobra.Command {
	return daemon.NewServeCommand()
}
