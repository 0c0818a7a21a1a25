// Command airlock is the airlock CLI and server (`airlock serve`); see internal/cli.
package main

import "github.com/airlockhq/airlock/internal/cli"

func main() { cli.Execute() }
