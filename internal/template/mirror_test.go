package template

import (
	"path/filepath"
	"testing"

	"github.com/airlockhq/airlock/internal/errdefs"
)

func TestMirrorFromApt(t *testing.T) {
	tests := []struct {
		name, dir, want string
		notFound        bool
	}{
		{name: "deb822-skips-security", dir: "deb822", want: "http://mirror.example/debian"},
		{name: "list-with-options", dir: "list-options", want: "http://opts.example/debian"},
		{name: "disabled-stanza-and-continuation", dir: "disabled-first", want: "http://continued.example/debian"},
		{name: "sources-list-first", dir: "list-before-d", want: "http://first.example/debian"},
		{name: "only-security-and-cdrom", dir: "only-security", notFound: true},
		{name: "no-apt-config", dir: "missing", notFound: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mirrorFromApt(filepath.Join("testdata", "apt", tc.dir))
			if tc.notFound {
				if !errdefs.IsNotFound(err) {
					t.Errorf("got %q, %v; want not found", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestMirrorEnvOverride(t *testing.T) {
	t.Setenv(MirrorEnv, "http://override.example/debian")
	got, err := Mirror()
	if err != nil || got != "http://override.example/debian" {
		t.Errorf("Mirror() = %q, %v", got, err)
	}
}
