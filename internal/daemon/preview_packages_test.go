package daemon

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlockhq/airlock/api"
	"github.com/airlockhq/airlock/client"
	"github.com/airlockhq/airlock/internal/network"
	"github.com/airlockhq/airlock/internal/pkgcache"
)

// TestBuildsShareThePackageCache: with the package mirror on, the plain
// HTTP of two template builds' RUN steps to the Debian mirror goes through
// the cache: both get the package, the registry is asked once, and each
// fetch is a package event with name and version.
func TestBuildsShareThePackageCache(t *testing.T) {
	w := newFakeWorld(t)
	var (
		mu  sync.Mutex
		evs []pkgcache.Event
	)
	opts := w.options()
	base := opts.Network
	opts.Network = func(c *network.Config) {
		base(c)
		store, err := pkgcache.OpenStore(t.TempDir(), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		c.PackageCache = store
		c.Upstreams = map[string]string{pkgcache.RegDebian: "http://deb.test/debian"}
		c.PackageAudit = func(e pkgcache.Event) {
			mu.Lock()
			evs = append(evs, e)
			mu.Unlock()
		}
	}
	_, tc, _, _, _ := templateDaemonWith(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Steps differ (the echo), so that the build cache does not skip the
	// second RUN.
	for _, name := range []string{"cached1", "cached2"} {
		st, err := tc.BuildTemplate(ctx, api.TemplateBuildRequest{Name: name, Dockerfile: "FROM base\nCOPY fetch.py /tmp/\nRUN python3 /tmp/fetch.py && echo " + name + "\n"},
			client.BuildUploads{Context: bytes.NewReader(tarOf(t, map[string]string{"fetch.py": fetchPy}))})
		if err != nil {
			t.Fatal(err)
		}
		var logBuf bytes.Buffer
		b, err := tc.FollowTemplateBuild(ctx, st.BuildID, &logBuf)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status != api.BuildReady || !strings.Contains(logBuf.String(), fmt.Sprintf("fetched %d bytes", len(fakeDeb))) {
			t.Fatalf("build %s %+v:\n%s", name, b, logBuf.String())
		}
	}
	if w.deb.Hits() != 1 {
		t.Fatalf("the registry was asked %d times, want 1", w.deb.Hits())
	}
	mu.Lock()
	defer mu.Unlock()
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%s %s %s cached=%v", e.Registry, e.Name, e.Version, e.Cached))
	}
	if want := "debian hello 1.0 cached=false|debian hello 1.0 cached=true"; strings.Join(got, "|") != want {
		t.Fatalf("package events %v, want %s", got, want)
	}
}
