package daemon

import (
	"context"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/driver/gvisor"
	"github.com/airlockhq/airlock/internal/driver/runc"
	"github.com/airlockhq/airlock/internal/hostslot"
)

// gvisorProbeTimeout bounds the start-up probe of runsc: it starts a
// throw-away sandbox (≈ 200 ms), and a platform that cannot work hangs.
const gvisorProbeTimeout = 30 * time.Second

// newDrivers makes every runtime this host may offer. A runtime that cannot
// start is left out with a warning (the manager then answers
// runtime_unavailable for it). closeAll releases them all.
//
// gvisor is registered whenever its driver can be made, healthy or not: the
// manager refuses to create sandboxes on an unhealthy runtime
// (runtime_unavailable), GET /v1/info shows why it is unhealthy, and
// sandboxes of an earlier daemon can still be recovered or destroyed.
//
// The cgroup parent and uid ranges are the host slot's (names): no two
// daemons' sandboxes share host uids.
func newDrivers(cfg config.Config, agentPath string, names hostslot.Names, log *slog.Logger) (drivers []driver.Driver, closeAll func()) {
	var closers []func()
	rd, err := runc.New(runc.Config{DataDir: cfg.DataDir, AgentPath: agentPath, Logger: log, MaxSandboxes: hostslot.UIDRanges,
		CgroupParent: names.CgroupParent, UIDRangeStart: names.RuncUIDStart, IDCount: hostslot.IDCount})
	if err != nil {
		log.Warn("runc driver unavailable", "err", err)
	} else {
		closers = append(closers, func() { rd.Close() })
		drivers = append(drivers, rd)
	}
	// Its own data dir: uid slots, sandbox dirs and runsc state are per
	// driver, and its uid ranges start above runc's.
	gd, err := gvisor.New(gvisor.Config{
		DataDir: filepath.Join(cfg.DataDir, "gvisor"), AgentPath: agentPath, Logger: log,
		MaxSandboxes: hostslot.UIDRanges, Platform: cfg.GVisorPlatform,
		CgroupParent: names.CgroupParent, UIDRangeStart: names.GVisorUIDStart,
	})
	if err != nil {
		log.Warn("gvisor driver unavailable", "err", err)
	} else {
		closers = append(closers, func() { gd.Close() })
		drivers = append(drivers, gd)
		ctx, cancel := context.WithTimeout(context.Background(), gvisorProbeTimeout)
		h := gd.Probe(ctx)
		cancel()
		if h.State != driver.HealthHealthy {
			log.Warn("gvisor runtime not usable", "state", h.State, "reason", h.Description)
		}
	}
	return drivers, func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
}
