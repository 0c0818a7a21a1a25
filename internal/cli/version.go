package cli

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/internal/version"
)

func versionString() string { return version.Version }

func (a *app) newVersionCmd() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the CLI's version, and the server's when it answers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := map[string]string{"client": versionString(), "go": runtime.Version()}
			if !clientOnly {
				// Best effort: version must work without a server.
				if c, err := a.client(); err == nil {
					ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
					if info, err := c.Info(ctx); err == nil {
						out["server"] = info.Version
					} else {
						out["server_error"] = oneLine(err)
					}
					cancel()
				}
			}
			if a.output == "json" {
				return printJSON(a.stdout, out)
			}
			fmt.Fprintf(a.stdout, "airlock %s (%s %s/%s)\n", out["client"], out["go"], runtime.GOOS, runtime.GOARCH)
			switch {
			case out["server"] != "":
				fmt.Fprintf(a.stdout, "server  %s\n", out["server"])
			case out["server_error"] != "":
				fmt.Fprintf(a.stdout, "server  unknown: %s\n", out["server_error"])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "do not ask the server")
	return cmd
}
