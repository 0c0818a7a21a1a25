package cli

import (
	"context"
	"fmt"
	"log/slog"
	"net"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/client"
	mcpplane "github.com/airlockhq/airlock/internal/plane/mcp"
)

func (a *app) newMCPCmd() *cobra.Command {
	var httpAddr string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve airlock's sandbox tools to an MCP host (stdio, or streamable HTTP with --http)",
		Long: `Serve airlock's tools over the Model Context Protocol: create_sandbox,
run_command, run_code, read_file, write_file, list_files and kill_sandbox.
Every tool calls the airlock server's HTTP API with an API key, so the key's
tenant, quotas, resource limits, TTL and audit apply, and a session sees its
own tenant's sandboxes only.

Without --http, one session runs on stdin and stdout (how an MCP host such as
Claude Desktop starts a server): the server and the key are found as for
every command (--url, $AIRLOCK_URL; --api-key, $AIRLOCK_API_KEY, the key
files; see airlock --help).

With --http ADDR, the streamable HTTP transport is served at
http://ADDR` + mcpplane.HTTPPath + `. Each request must carry
"Authorization: Bearer <airlock API key>" (none or a refused one: 401); a
session's tool calls use the key that opened it, and sessions of different
keys never see each other's sandboxes. This process's own key is not used.
Listen on a loopback address unless a TLS proxy is in front: keys travel in
the requests.

See docs/mcp.md for a host's configuration.`,
		Example: `  airlock mcp
  AIRLOCK_API_KEY=ak_... airlock mcp --url http://127.0.0.1:7070
  airlock mcp --http 127.0.0.1:7071`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			go func() {
				select {
				case <-a.interrupts:
					cancel()
				case <-ctx.Done():
				}
			}()
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			opts := mcpplane.Options{
				Version: versionString(),
				Logger:  slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level})),
			}
			if httpAddr != "" {
				u := a.url
				if u == "" {
					u = a.getenv(client.EnvURL)
				}
				h, err := mcpplane.NewHTTPHandler(mcpplane.HTTPOptions{Options: opts, BaseURL: u, UserAgent: "airlock-mcp/" + versionString()})
				if err != nil {
					return usagef("%v", err)
				}
				if u == "" {
					u = client.DefaultURL
				}
				return mcpplane.ListenAndServe(ctx, httpAddr, h, func(addr net.Addr) {
					fmt.Fprintf(a.stderr, "airlock mcp: serving MCP (streamable HTTP) at http://%s%s for %s\n", addr, mcpplane.HTTPPath, u)
				})
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if a.noKey {
				fmt.Fprintln(a.stderr, "airlock mcp: no API key found (set AIRLOCK_API_KEY or ~/.config/airlock/key): every tool call will be refused")
			}
			return mcpplane.Serve(ctx, c, a.stdin, a.stdout, opts)
		},
	}
	cmd.Flags().StringVar(&httpAddr, "http", "", "serve streamable HTTP on this address (e.g. 127.0.0.1:7071) instead of stdio")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log each tool error's code on stderr")
	return cmd
}
