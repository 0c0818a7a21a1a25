package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"
)

func (a *app) newPreviewCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "preview",
		Short: "Expose a sandbox's TCP port at a preview URL",
		Long: `Expose a TCP port of a sandbox (a web server it runs) at a preview URL,
http://<port>-<sandbox id>.<preview domain>:<preview port>/, served by the daemon's
preview listener. A private preview needs the sandbox's token once (?token=, which
sets a cookie) or as the X-Airlock-Preview-Token header; a public one needs none.`,
		Example: `  airlock preview open sbx_abc 8080
  airlock preview open sbx_abc 8080 --public
  airlock preview ls sbx_abc
  airlock preview close sbx_abc 8080`,
	}
	var public bool
	open := &cobra.Command{
		Use:   "open SANDBOX PORT",
		Short: "Expose a port and print its URL",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("port %q is not a number", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			p, err := c.CreatePreview(cmd.Context(), args[0], port, public)
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, p)
			}
			if p.Public {
				fmt.Fprintln(a.stdout, p.URL)
			} else {
				fmt.Fprintf(a.stdout, "%s?token=%s\n", p.URL, p.Token)
			}
			return nil
		},
	}
	open.Flags().BoolVar(&public, "public", false, "no token needed")
	ls := &cobra.Command{
		Use:     "ls SANDBOX",
		Aliases: []string{"list"},
		Short:   "List a sandbox's exposed ports",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			list, err := c.ListPreviews(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, list)
			}
			t := newTable(a.stdout, "PORT", "PUBLIC", "URL")
			for _, p := range list {
				t.row(strconv.Itoa(p.Port), strconv.FormatBool(p.Public), p.URL)
			}
			return t.flush()
		},
	}
	closeCmd := &cobra.Command{
		Use:   "close SANDBOX PORT",
		Short: "Stop exposing a port",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			port, err := strconv.Atoi(args[1])
			if err != nil {
				return fmt.Errorf("port %q is not a number", args[1])
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeletePreview(cmd.Context(), args[0], port); err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, map[string]any{"sandbox_id": args[0], "port": port, "closed": true})
			}
			return nil
		},
	}
	cmd.AddCommand(open, ls, closeCmd)
	return cmd
}
