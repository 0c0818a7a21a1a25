package cli

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/api"
)

func (a *app) newKeysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "keys",
		Aliases: []string{"key"},
		Short:   "Manage API keys (create and revoke need an admin key)",
		Args:    cobra.ArbitraryArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(a.newKeysCreateCmd(), a.newKeysLsCmd(), a.newKeysRmCmd())
	return cmd
}

func (a *app) newKeysCreateCmd() *cobra.Command {
	var (
		req   api.CreateKeyRequest
		rps   float64
		burst int
	)
	cmd := &cobra.Command{
		Use:   "create --tenant TENANT [--name NAME] [--admin] [--format native|e2b] [--rate-limit-rps N --rate-limit-burst N]",
		Short: "Create an API key and print its secret (shown this once)",
		Long: "Create an API key and print its secret (shown this once).\n\n" +
			"--format e2b issues the key as e2b_ and 40 hex digits, the shape E2B's SDKs check\n" +
			"(the Python SDK refuses other keys unless E2B_VALIDATE_API_KEY=false). Both formats\n" +
			"are accepted alike by every API of the daemon.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Tenant == "" {
				return usagef("--tenant is required")
			}
			switch req.Format {
			case api.KeyFormatNative:
				req.Format = "" // the default; a daemon before formats accepts no field
			case "", api.KeyFormatE2B:
			default:
				return usagef("--format must be %s or %s", api.KeyFormatNative, api.KeyFormatE2B)
			}
			// Only flags given set the key's own limit; otherwise the
			// server's default applies.
			if cmd.Flags().Changed("rate-limit-rps") {
				req.RateLimitRPS = &rps
			}
			if cmd.Flags().Changed("rate-limit-burst") {
				req.RateLimitBurst = &burst
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if req.Format == api.KeyFormatE2B && !strings.HasPrefix(k.Key, "e2b_") {
				// A daemon that ignores the field made a native key: not
				// what was asked for, so it does not stay.
				rctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 30*time.Second)
				defer cancel()
				if err := c.DeleteKey(rctx, k.ID); err != nil {
					return fmt.Errorf("the daemon issued a native key instead of an e2b one, and revoking it (%s) failed: %w", k.ID, err)
				}
				return fmt.Errorf("the daemon does not issue e2b keys (it made a native one, %s, now revoked)", k.ID)
			}
			if a.output == "json" {
				return printJSON(a.stdout, k)
			}
			// The secret alone on stdout, for `KEY=$(airlock keys create …)`;
			// the rest on stderr.
			fmt.Fprintf(a.stderr, "created %s for tenant %s; the key is shown only now:\n", k.ID, k.Tenant)
			_, err = fmt.Fprintln(a.stdout, k.Key)
			return err
		},
	}
	cmd.Flags().StringVar(&req.Tenant, "tenant", "", "tenant the key acts for")
	cmd.Flags().StringVar(&req.Name, "name", "", "a label for the key")
	cmd.Flags().BoolVar(&req.Admin, "admin", false, "an admin key (acts on every tenant)")
	cmd.Flags().StringVar(&req.Format, "format", api.KeyFormatNative, "the secret's shape: native (ak_…) or e2b (e2b_ and hex, for E2B's SDKs)")
	cmd.Flags().Float64Var(&rps, "rate-limit-rps", 0, "the key's own requests per second (0: no limit; default: the server's)")
	cmd.Flags().IntVar(&burst, "rate-limit-burst", 0, "the key's own burst (default: the server's)")
	return cmd
}

func (a *app) newKeysLsCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List API keys (never their secrets)",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			keys, err := c.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == "json" {
				if keys == nil {
					keys = []api.Key{}
				}
				return printJSON(a.stdout, keys)
			}
			now := time.Now()
			t := newTable(a.stdout, "ID", "TENANT", "NAME", "PREFIX", "ADMIN", "CREATED", "REVOKED")
			for _, k := range keys {
				admin := ""
				if k.Admin {
					admin = "yes"
				}
				revoked := ""
				if k.RevokedAt != nil {
					revoked = ago(*k.RevokedAt, now)
				}
				t.row(k.ID, k.Tenant, k.Name, k.Prefix, admin, ago(k.CreatedAt, now), revoked)
			}
			return t.flush()
		},
	}
}

func (a *app) newKeysRmCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "rm KEY_ID",
		Aliases: []string{"revoke", "delete"},
		Short:   "Revoke an API key (effective at once)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			if err := c.DeleteKey(cmd.Context(), args[0]); err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, map[string]any{"id": args[0], "revoked": true})
			}
			return nil
		},
	}
}
