package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/internal/driver"
	"github.com/airlockhq/airlock/internal/errdefs"
	"github.com/airlockhq/airlock/internal/hostcheck"
	"github.com/airlockhq/airlock/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRecipe builds a tiny tree and counts its builds.
func fakeRecipe(builds *atomic.Int32, revision int, fail error) recipe {
	return recipe{
		name: "fake",
		Spec: recipeSpec{Suite: "test", Revision: revision},
		build: func(ctx context.Context, rootfs string, spec recipeSpec, p *progress) error {
			builds.Add(1)
			if err := os.MkdirAll(filepath.Join(rootfs, "etc"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(rootfs, "etc/os-release"), []byte("fake\n"), 0o644); err != nil {
				return err
			}
			p.step("fake build")
			select { // long enough for concurrent callers to pile up
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
			return fail
		},
	}
}

func newFakeStore(dir string, r recipe) *Store {
	s := NewStore(dir)
	s.base = r
	return s
}

func TestEnsureBuildsOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	var builds atomic.Int32
	r := fakeRecipe(&builds, 1, nil)
	const callers = 6
	var wg sync.WaitGroup
	got := make([]driver.Template, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A Store each: separate lock files, as separate processes have.
			got[i], errs[i] = newFakeStore(dir, r).EnsureBase(context.Background(), nil)
		}()
	}
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if got[i].Name != "fake" || got[i].Version != 1 || len(got[i].Layers) != 1 || got[i].Layers[0] != got[0].Layers[0] {
			t.Errorf("caller %d got %+v, caller 0 %+v", i, got[i], got[0])
		}
	}
	if n := builds.Load(); n != 1 {
		t.Errorf("built %d times, want 1", n)
	}
	b, err := os.ReadFile(filepath.Join(got[0].Layers[0], "etc/os-release"))
	if err != nil || string(b) != "fake\n" {
		t.Errorf("template content: %q, %v", b, err)
	}
	// And later callers do not build either.
	if _, err := newFakeStore(dir, r).EnsureBase(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if n := builds.Load(); n != 1 {
		t.Errorf("cached template rebuilt: %d builds", n)
	}
}

func TestRecipeChangeBumpsVersion(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	var builds atomic.Int32
	ctx := context.Background()
	v1, err := newFakeStore(dir, fakeRecipe(&builds, 1, nil)).EnsureBase(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	v2, err := newFakeStore(dir, fakeRecipe(&builds, 2, nil)).EnsureBase(ctx, &out)
	if err != nil {
		t.Fatal(err)
	}
	if v1.Version != 1 || v2.Version != 2 {
		t.Errorf("versions %d, %d; want 1, 2", v1.Version, v2.Version)
	}
	if !strings.Contains(out.String(), "version 2") || !strings.Contains(out.String(), "fake build") {
		t.Errorf("progress does not tell the steps:\n%s", out.String())
	}
	s := NewStore(dir)
	tests := []struct {
		name    string
		version int
		want    int
	}{
		{"newest", 0, 2},
		{"first", 1, 1},
		{"second", 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.Get("fake", tc.version)
			if err != nil || got.Version != tc.want {
				t.Errorf("Get(fake, %d) = %+v, %v; want version %d", tc.version, got, err, tc.want)
			}
		})
	}
	// Going back to the first recipe reuses its version.
	again, err := newFakeStore(dir, fakeRecipe(&builds, 1, nil)).EnsureBase(ctx, nil)
	if err != nil || again.Version != 1 {
		t.Errorf("old recipe: %+v, %v; want version 1", again, err)
	}
	if n := builds.Load(); n != 2 {
		t.Errorf("%d builds, want 2", n)
	}
	infos, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || infos[0].Version != 2 || infos[1].Version != 1 || infos[0].RecipeHash == infos[1].RecipeHash {
		t.Errorf("List() = %+v", infos)
	}
	for _, in := range infos {
		if in.Name != "fake" || in.SizeBytes <= 0 || in.CreatedAt.IsZero() {
			t.Errorf("incomplete info %+v", in)
		}
	}
}

func TestGetErrors(t *testing.T) {
	s := NewStore(filepath.Join(t.TempDir(), "templates"))
	tests := []struct {
		name    string
		tmpl    string
		version int
		class   error
	}{
		{"missing", "base", 0, errdefs.ErrNotFound},
		{"missing-version", "base", 3, errdefs.ErrNotFound},
		{"path-in-name", "../etc", 0, errdefs.ErrInvalidArgument},
		{"build-dir-name", ".build-base-1", 0, errdefs.ErrInvalidArgument},
		{"negative-version", "base", -1, errdefs.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Get(tc.tmpl, tc.version); !errors.Is(err, tc.class) {
				t.Errorf("got %v, want %v", err, tc.class)
			}
		})
	}
	if infos, err := s.List(); err != nil || len(infos) != 0 {
		t.Errorf("List of an empty store: %v, %v", infos, err)
	}
}

// assertNothingRegistered checks that a failed build left no template and no
// build directory.
func assertNothingRegistered(t *testing.T, dir, name string) {
	t.Helper()
	s := NewStore(dir)
	if _, err := s.Get(name, 0); !errdefs.IsNotFound(err) {
		t.Errorf("Get after a failed build: %v, want not found", err)
	}
	if infos, err := s.List(); err != nil || len(infos) != 0 {
		t.Errorf("List after a failed build: %+v, %v", infos, err)
	}
	left, _ := filepath.Glob(filepath.Join(dir, buildPrefix+"*"))
	if len(left) > 0 {
		t.Errorf("build dirs left: %v", left)
	}
}

func TestFailedBuildLeavesNothing(t *testing.T) {
	tests := []struct {
		name  string
		root  bool
		build func(ctx context.Context, rootfs string) error
	}{
		{"error-after-writing", false, func(ctx context.Context, rootfs string) error {
			if err := os.MkdirAll(filepath.Join(rootfs, "usr/bin"), 0o755); err != nil {
				return err
			}
			return errors.New("boom")
		}},
		{"error-with-mount-left", true, func(ctx context.Context, rootfs string) error {
			// Like a killed debootstrap that had /proc mounted in its target.
			p := filepath.Join(rootfs, "proc")
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			if err := unix.Mount("tmpfs", p, "tmpfs", 0, "size=1m"); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, "precious"), nil, 0o644)
		}},
		{"cancelled", false, func(ctx context.Context, rootfs string) error {
			<-ctx.Done()
			return ctx.Err()
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				testutil.RequiresRoot(t)
			}
			dir := filepath.Join(t.TempDir(), "templates")
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, lockName), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			leaks := hostcheck.Take(t, dir)
			s := NewStore(dir)
			s.base = recipe{name: "base", build: func(ctx context.Context, rootfs string, _ recipeSpec, _ *progress) error {
				if err := tc.build(ctx, rootfs); err != nil {
					return err
				}
				return errors.New("failed after leaving a mount")
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if _, err := s.EnsureBase(ctx, nil); err == nil {
				t.Fatal("EnsureBase succeeded")
			}
			assertNothingRegistered(t, dir, "base")
			leaks.AssertNoLeaks(t)
		})
	}
}

func TestWaitForLockHonoursContext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	var builds atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var out strings.Builder
	_, err = newFakeStore(dir, fakeRecipe(&builds, 1, nil)).EnsureBase(ctx, &out)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("EnsureBase while another holds the lock: %v", err)
	}
	if builds.Load() != 0 {
		t.Error("built without the lock")
	}
	if !strings.Contains(out.String(), "waiting for another build") {
		t.Errorf("no progress while waiting:\n%s", out.String())
	}
}

func TestStaleBuildRemoved(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "templates")
	stale := filepath.Join(dir, buildPrefix+"fake-123", "rootfs", "etc")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	var builds atomic.Int32
	if _, err := newFakeStore(dir, fakeRecipe(&builds, 1, nil)).EnsureBase(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, buildPrefix+"fake-123")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale build dir not removed: %v", err)
	}
}
