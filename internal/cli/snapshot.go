package cli

import "github.com/spf13/cobra"

// snapshotCommands are `airlock snapshot`, `airlock fork` and `airlock
// reset` (issue 15): none yet.
func (a *app) snapshotCommands() []*cobra.Command { return nil }
