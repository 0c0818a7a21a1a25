// Command airlock is the airlock CLI and server (`airlock serve`); see internal/cli and internal/daemon.
//
// One binary: internal/cli holds the client commands and imports nothing
// of the daemon; the daemon's `serve` is handed to it here.
package main

import (
	"github.com/airlockhq/airlock/internal/cli"
	"github.com/airlockhq/airlock/internal/daemon"
)

func main() { cli.Execute(daemon.NewServeCommand) }
