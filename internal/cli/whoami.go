package cli

import (
	"strconv"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/client"
)

func (a *app) newWhoamiCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the server and the API key in use: its tenant, id, name, and whether it is an admin key",
		Long: `Show which server the CLI talks to and who its API key is: the key's tenant,
id and name, whether it is an admin key, and where the key was found (--api-key,
$AIRLOCK_API_KEY, a key file). The key's secret is never printed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			id, err := c.WhoAmI(cmd.Context())
			if err != nil {
				return err
			}
			if a.output == "json" {
				return printJSON(a.stdout, struct {
					client.Identity
					KeySource string `json:"key_source"`
				}{*id, a.keySource})
			}
			admin := "no"
			if id.Admin {
				admin = "yes"
			}
			var limit string
			if id.RateLimitRPS != nil {
				limit = strconv.FormatFloat(*id.RateLimitRPS, 'f', -1, 64) + " req/s"
				if id.RateLimitBurst != nil {
					limit += ", burst " + strconv.Itoa(*id.RateLimitBurst)
				}
			}
			return kvTable(a.stdout, [][2]string{
				{"server", id.URL},
				{"tenant", id.Tenant},
				{"admin", admin},
				{"key", id.KeyID},
				{"name", id.KeyName},
				{"prefix", id.Prefix},
				{"rate limit", limit},
				{"key from", a.keySource},
			})
		},
	}
}
