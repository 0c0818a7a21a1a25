// Command airlock-bench measures a running airlock server against local baselines; see internal/bench.
package main

import (
	"os"

	"github.com/airlockhq/airlock/internal/bench"
)

func main() { os.Exit(bench.Main(os.Args[1:], os.Stdout, os.Stderr)) }
