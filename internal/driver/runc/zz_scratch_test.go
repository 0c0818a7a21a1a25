package runc

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/airlockhq/airlock/internal/driver"
)

func TestScratchVariants(t *testing.T) {
	requireHost(t)
	tmpl := baseTemplate(t)
	d := newDriver(t, newDataDir(t))
	ctx := context.Background()
	id := "sbx_var"
	if _, err := d.Create(ctx, driver.Spec{ID: id, Template: tmpl}); err != nil {
		t.Fatal(err)
	}
	defer d.Destroy(ctx, id)
	dir := d.dir(id)
	base, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	variants := map[string]func(s *specs.Spec){
		"full":       func(s *specs.Spec) {},
		"noseccomp":  func(s *specs.Spec) { s.Linux.Seccomp = nil },
		"nomasked":   func(s *specs.Spec) { s.Linux.MaskedPaths = nil; s.Linux.ReadonlyPaths = nil },
		"nores":      func(s *specs.Spec) { s.Linux.Resources = nil },
		"true":       func(s *specs.Spec) { s.Process.Args = []string{"/bin/true"} },
		"true_noseccomp": func(s *specs.Spec) { s.Process.Args = []string{"/bin/true"}; s.Linux.Seccomp = nil },
	}
	for name, f := range variants {
		var s specs.Spec
		json.Unmarshal(base, &s)
		f(&s)
		b, _ := json.Marshal(&s)
		os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
		var total time.Duration
		for i := 0; i < 5; i++ {
			cid := fmt.Sprintf("v%s%d", name, i)
			t0 := time.Now()
			out, err := exec.Command(d.runc.path, "--root", d.runc.root, "run", "--detach", "--bundle", dir, cid).CombinedOutput()
			total += time.Since(t0)
			if err != nil {
				t.Fatalf("%s: %v %s", name, err, out)
			}
			exec.Command(d.runc.path, "--root", d.runc.root, "delete", "--force", cid).Run()
		}
		t.Logf("%s: %v", name, total/5)
	}
}
