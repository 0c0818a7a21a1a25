package cli

import "github.com/spf13/cobra"

// poolCommands are `airlock pool` (issue 15): none yet.
func (a *app) poolCommands() []*cobra.Command { return nil }
