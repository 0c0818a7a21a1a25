package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

// startBuild takes a version of tenant/name and returns it with its build id.
func startBuild(t *testing.T, s *Store, tenant, name string, n int) (int, string) {
	t.Helper()
	id := fmt.Sprintf("bld_%s_%s_%d", tenant, name, n)
	v, err := s.StartTemplateBuild(context.Background(),
		TemplateVersion{ID: "tpl_" + id, Tenant: tenant, Name: name, Source: "spec", CreatedAt: t0},
		TemplateBuild{ID: id, CreatedAt: t0})
	if err != nil {
		t.Fatal(err)
	}
	return v, id
}

func finish(t *testing.T, s *Store, id string, ok bool, layers ...string) {
	t.Helper()
	err := s.FinishTemplateBuild(context.Background(), id, BuildResult{
		OK: ok, Layers: layers, Config: json.RawMessage(`{"env":{"A":"1"}}`), Error: "boom", Log: []byte("log"), EndedAt: t0,
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTemplateVersions(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()

	// Concurrent builds of one name take distinct, consecutive numbers.
	var wg sync.WaitGroup
	versions := make([]int, 8)
	for i := range versions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := s.StartTemplateBuild(ctx, TemplateVersion{ID: fmt.Sprintf("tpl_c%d", i), Tenant: "t1", Name: "conc", CreatedAt: t0},
				TemplateBuild{ID: fmt.Sprintf("bld_c%d", i), CreatedAt: t0})
			if err != nil {
				t.Error(err)
			}
			versions[i] = v
		}()
	}
	wg.Wait()
	slices.Sort(versions)
	if !slices.Equal(versions, []int{1, 2, 3, 4, 5, 6, 7, 8}) {
		t.Errorf("concurrent versions %v", versions)
	}

	v1, b1 := startBuild(t, s, "t1", "app", 1)
	v2, b2 := startBuild(t, s, "t1", "app", 2)
	v3, b3 := startBuild(t, s, "t1", "app", 3)
	o1, ob1 := startBuild(t, s, "t2", "app", 1) // another tenant counts on its own
	if v1 != 1 || v2 != 2 || v3 != 3 || o1 != 1 {
		t.Fatalf("versions %d %d %d, other tenant %d", v1, v2, v3, o1)
	}
	if _, err := s.GetTemplateVersion(ctx, []string{"t1"}, "app", 0); !errdefs.IsNotFound(err) {
		t.Errorf("a building version resolved: %v", err)
	}
	finish(t, s, b1, true, "base/1", "layers/a")
	finish(t, s, b2, false) // failed: never resolved, but its number stays taken
	finish(t, s, b3, true, "base/1", "layers/c")
	finish(t, s, ob1, true, "base/1", "layers/o")
	if err := s.FinishTemplateBuild(ctx, b3, BuildResult{OK: true, EndedAt: t0}); !errors.Is(err, errdefs.ErrInvalidState) {
		t.Errorf("finishing twice: %v", err)
	}

	tests := []struct {
		name    string
		tenants []string
		version int
		want    int // 0: not found
	}{
		{"newest", []string{"t1", ""}, 0, 3},
		{"pinned", []string{"t1", ""}, 1, 1},
		{"failed", []string{"t1", ""}, 2, 0},
		{"other-tenant", []string{"t3", ""}, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tv, err := s.GetTemplateVersion(ctx, tc.tenants, "app", tc.version)
			if tc.want == 0 {
				if !errdefs.IsNotFound(err) {
					t.Errorf("got %+v, %v; want not found", tv, err)
				}
				return
			}
			if err != nil || tv.Version != tc.want || tv.State != TemplateReady || string(tv.Config) != `{"env":{"A":"1"}}` {
				t.Errorf("got %+v, %v; want version %d", tv, err, tc.want)
			}
		})
	}
	b, err := s.GetTemplateBuild(ctx, b2)
	if err != nil || b.Status != TemplateFailed || b.Error != "boom" || string(b.Log) != "log" || b.EndedAt == nil {
		t.Errorf("failed build %+v %v", b, err)
	}
	l, err := s.ListTemplateVersions(ctx, []string{"t1", ""})
	if err != nil || len(l) != 2 || l[0].Version != 3 || l[1].Version != 1 {
		t.Errorf("list %+v %v", l, err)
	}

	// Delete with a live sandbox on version 1 (and one of another tenant
	// that happens to use the same name and number, which does not count).
	for _, sb := range []Sandbox{sandbox("sbx_a", "t1", t0), sandbox("sbx_b", "t2", t0)} {
		sb.Template, sb.TemplateVersion = "app", 1
		if _, err := s.CreateSandbox(ctx, sb, nil); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DeleteTemplateVersions(ctx, "t1", "app", 0, t0)
	if err != nil || n != 2 {
		t.Fatalf("deleted %d, %v", n, err)
	}
	dead, err := s.CollectableTemplateVersions(ctx)
	if err != nil || len(dead) != 1 || dead[0].Version != 3 || dead[0].Tenant != "t1" {
		t.Fatalf("collectable %+v %v", dead, err)
	}
	if err := s.MarkTemplateVersionPurged(ctx, dead[0].ID); err != nil {
		t.Fatal(err)
	}
	keep, err := s.ReferencedTemplateLayers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !keep["layers/a"] || keep["layers/c"] || !keep["base/1"] || !keep["layers/o"] {
		t.Errorf("referenced layers %v", keep)
	}
	if purged, err := s.PurgedTemplateLayers(ctx); err != nil || !purged["layers/c"] || purged["layers/a"] {
		t.Errorf("purged layers %v %v", purged, err)
	}
	sb, _ := s.GetSandbox(ctx, "sbx_a", "")
	sb.State = "stopped"
	if err := s.UpdateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if dead, _ := s.CollectableTemplateVersions(ctx); len(dead) != 1 || dead[0].Version != 1 {
		t.Errorf("after the sandbox stopped: %+v", dead)
	}
	// Numbers are never reused.
	if v, _ := startBuild(t, s, "t1", "app", 4); v != 4 {
		t.Errorf("next version %d, want 4", v)
	}

	n, err = s.FailUnfinishedTemplateBuilds(ctx, "daemon restarted", t0)
	if err != nil || n != 9 { // the 8 concurrent ones and app 4
		t.Errorf("failed %d unfinished builds, %v", n, err)
	}
}
