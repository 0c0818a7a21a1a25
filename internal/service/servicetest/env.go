package servicetest

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlockhq/airlock/internal/config"
	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/service"
	"github.com/airlockhq/airlock/internal/store"
)

// Options adjust an Env.
type Options struct {
	// Templates is the template catalog; default base@1.
	Templates Templates
	// Configure edits the services' configuration before they are made
	// (Settings, timings, sinks).
	Configure func(*service.Config)
}

// Env is the whole service graph (internal/service) over the fake driver
// and a fresh store: what a service's test drives without a plane.
type Env struct {
	*service.Set
	Store *store.Store
	// DBPath is the store's file.
	DBPath string
	Driver *Driver
}

// Start makes and starts an Env, closed when t ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "airlock.db")
	st, err := store.Open(context.Background(), dbPath)
	if err != nil {
		t.Fatal(err)
	}
	drv := New("runc", filepath.Join(dir, "sandboxes"))
	settings := config.Default()
	settings.DataDir = dir
	if o.Templates == nil {
		o.Templates = Templates{"base": {{Name: "base", Version: 1}}}
	}
	cfg := service.Config{
		Settings: settings, Store: st, Drivers: []driver.Driver{drv}, Templates: o.Templates,
		Logger: Logger(), AgentDialTimeout: 5 * time.Second, ExecRetention: time.Minute,
	}
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	set, err := service.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := set.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		set.Close()
		if err := drv.Close(); err != nil {
			t.Errorf("driver cleanup: %v", err)
		}
		st.Close()
	})
	return &Env{Set: set, Store: st, DBPath: dbPath, Driver: drv}
}

// Logger is the services' logger in tests: silent, or debug output on
// stderr with AIRLOCK_TEST_LOG set.
func Logger() *slog.Logger {
	if os.Getenv("AIRLOCK_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}
