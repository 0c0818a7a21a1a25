package daemon

import (
	"log/slog"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/runc"
)

// newDrivers makes every runtime this host may offer. A runtime that cannot
// start is left out with a warning (the manager then answers
// runtime_unavailable for it); rd is the runc driver, which template builds
// use, or nil. closeAll releases them all.
func newDrivers(cfg config.Config, agentPath string, log *slog.Logger) (drivers []driver.Driver, rd *runc.Driver, closeAll func()) {
	var closers []func()
	rd, err := runc.New(runc.Config{DataDir: cfg.DataDir, AgentPath: agentPath, Logger: log, MaxSandboxes: max(cfg.MaxSandboxes, 1024)})
	if err != nil {
		log.Warn("runc driver unavailable", "err", err)
		rd = nil
	} else {
		closers = append(closers, func() { rd.Close() })
		drivers = append(drivers, rd)
	}
	return drivers, rd, func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
}
