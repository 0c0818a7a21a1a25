package cli

import (
	"encoding/json"
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/airlockhq/airlock/internal/hostslot"
)

// fakeSys plays a host for doctor. Zero value: a healthy cgroup-v1 host
// with everything installed, running as root.
type fakeSys struct {
	uid     int
	missing map[string]bool   // binaries not on PATH
	files   map[string]string // overrides of file contents ("" = absent)
	noKVM   bool
	badRunc bool
	slots   []hostslot.Slot
}

func (s fakeSys) HostSlots() ([]hostslot.Slot, error) { return s.slots, nil }

var healthyFiles = map[string]string{
	"/proc/cgroups": "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpuset\t3\t1\t1\ncpu\t4\t60\t1\ncpuacct\t4\t60\t1\n" +
		"memory\t7\t90\t1\ndevices\t5\t60\t1\nfreezer\t9\t2\t1\npids\t8\t70\t1\n",
	"/proc/sys/user/max_user_namespaces": "96365\n",
	"/proc/sys/kernel/osrelease":         "6.1.0-18-amd64\n",
}

func (s fakeSys) Geteuid() int { return s.uid }

func (s fakeSys) LookPath(name string) (string, error) {
	if s.missing[name] {
		return "", errors.New("executable file not found in $PATH")
	}
	return "/usr/bin/" + name, nil
}

func (s fakeSys) Output(name string, args ...string) (string, error) {
	if strings.HasSuffix(name, "runc") && s.badRunc {
		return "", errors.New("exit status 2")
	}
	return strings.TrimPrefix(name, "/usr/bin/") + " version 1.2.3\nmore\n", nil
}

func (s fakeSys) ReadFile(p string) ([]byte, error) {
	if v, ok := s.files[p]; ok {
		if v == "" {
			return nil, fs.ErrNotExist
		}
		return []byte(v), nil
	}
	if v, ok := healthyFiles[p]; ok {
		return []byte(v), nil
	}
	return nil, fs.ErrNotExist
}

func (s fakeSys) Stat(p string) (fs.FileInfo, error) {
	if p == "/opt/airlock/bin/airlock-agent" && !s.missing["airlock-agent"] {
		return fstest.MapFS{"a": {Data: []byte("x")}}.Stat("a")
	}
	return nil, fs.ErrNotExist
}

func (s fakeSys) OpenRW(string) error {
	if s.noKVM {
		return fs.ErrNotExist
	}
	return nil
}

func (s fakeSys) Executable() (string, error) { return "/opt/airlock/bin/airlock", nil }

func findCheck(t *testing.T, checks []check, name string) check {
	t.Helper()
	for _, c := range checks {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no check %q", name)
	return check{}
}

func TestDoctorChecks(t *testing.T) {
	tests := []struct {
		name       string
		sys        fakeSys
		check      string
		wantStatus string
		wantDetail string
		wantFix    string
	}{
		{name: "healthy root", check: "root", wantStatus: checkOK},
		{name: "not root", sys: fakeSys{uid: 1000}, check: "root", wantStatus: checkMissing, wantDetail: "uid 1000", wantFix: "sudo airlock serve"},
		{name: "runc version", check: "runc", wantStatus: checkOK, wantDetail: "/usr/bin/runc: runc version 1.2.3"},
		{name: "runc missing", sys: fakeSys{missing: map[string]bool{"runc": true}}, check: "runc",
			wantStatus: checkMissing, wantDetail: "not found", wantFix: "apt-get install runc"},
		{name: "runc broken", sys: fakeSys{badRunc: true}, check: "runc", wantStatus: checkMissing, wantDetail: "--version failed"},
		{name: "cgroup v1", check: "cgroups", wantStatus: checkOK, wantDetail: "v1: memory pids cpu freezer"},
		{name: "cgroup v1 without freezer", sys: fakeSys{files: map[string]string{
			"/proc/cgroups": "memory\t7\t90\t1\npids\t8\t70\t1\ncpu\t4\t60\t1\nfreezer\t0\t1\t1\n"}},
			check: "cgroups", wantStatus: checkMissing, wantDetail: "missing controllers freezer", wantFix: "kernel command line"},
		{name: "cgroup v1 memory disabled", sys: fakeSys{files: map[string]string{
			"/proc/cgroups": "memory\t7\t90\t0\npids\t8\t70\t1\ncpu\t4\t60\t1\nfreezer\t9\t1\t1\n"}},
			check: "cgroups", wantStatus: checkMissing, wantDetail: "missing controllers memory"},
		{name: "cgroup v2", sys: fakeSys{files: map[string]string{"/sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory hugetlb pids rdma\n"}},
			check: "cgroups", wantStatus: checkOK, wantDetail: "v2: memory pids cpu freezer"},
		{name: "cgroup v2 without pids", sys: fakeSys{files: map[string]string{"/sys/fs/cgroup/cgroup.controllers": "cpu memory\n"}},
			check: "cgroups", wantStatus: checkMissing, wantDetail: "v2: missing controllers pids", wantFix: "subtree_control"},
		{name: "no cgroups", sys: fakeSys{files: map[string]string{"/proc/cgroups": ""}}, check: "cgroups", wantStatus: checkMissing},
		{name: "userns off", sys: fakeSys{files: map[string]string{"/proc/sys/user/max_user_namespaces": "0\n"}},
			check: "user namespaces", wantStatus: checkMissing, wantFix: "sysctl -w user.max_user_namespaces"},
		{name: "old kernel", sys: fakeSys{files: map[string]string{"/proc/sys/kernel/osrelease": "5.10.0-28-amd64\n"}},
			check: "kernel", wantStatus: checkMissing, wantDetail: "need 5.19"},
		{name: "agent beside the binary", check: "airlock-agent", wantStatus: checkOK, wantDetail: "/opt/airlock/bin/airlock-agent"},
		{name: "agent missing", sys: fakeSys{missing: map[string]bool{"airlock-agent": true}}, check: "airlock-agent",
			wantStatus: checkMissing, wantFix: "make build"},
		{name: "debootstrap missing", sys: fakeSys{missing: map[string]bool{"debootstrap": true}}, check: "debootstrap",
			wantStatus: checkMissing, wantFix: "apt-get install debootstrap"},
		{name: "runsc missing", sys: fakeSys{missing: map[string]bool{"runsc": true}}, check: "runsc (gvisor)",
			wantStatus: checkMissing, wantFix: "apt-get install runsc"},
		{name: "qemu missing", sys: fakeSys{missing: map[string]bool{"qemu-system-x86_64": true}}, check: "qemu (microvm)",
			wantStatus: checkMissing, wantFix: "apt-get install qemu-system-x86"},
		{name: "no kvm", sys: fakeSys{noKVM: true}, check: "/dev/kvm (microvm)", wantStatus: checkMissing, wantFix: "modprobe kvm_intel"},
		{name: "no host slots", check: "host slots", wantStatus: checkInfo, wantDetail: "none claimed"},
		{name: "host slots", sys: fakeSys{slots: []hostslot.Slot{
			{Names: hostslot.NamesOf(0), DataDir: "/var/lib/airlock", PID: 42, Held: true},
			{Names: hostslot.NamesOf(2), DataDir: "/tmp/other"}}},
			check: "host slots", wantStatus: checkInfo, wantDetail: "0: /var/lib/airlock (pid 42, veths alv*); 2: /tmp/other (idle, veths al2v*)"},
		{name: "nft missing", sys: fakeSys{missing: map[string]bool{"nft": true}}, check: "nft (network allowlists)",
			wantStatus: checkMissing, wantFix: "apt-get install nftables"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := findCheck(t, runChecks(tt.sys), tt.check)
			if c.Status != tt.wantStatus || !strings.Contains(c.Detail, tt.wantDetail) || !strings.Contains(c.Fix, tt.wantFix) {
				t.Errorf("check = %+v, want status %q detail ~%q fix ~%q", c, tt.wantStatus, tt.wantDetail, tt.wantFix)
			}
		})
	}
}

func TestDoctorCommand(t *testing.T) {
	tests := []struct {
		name     string
		sys      fakeSys
		wantCode int
		want     string
	}{
		{name: "healthy", wantCode: 0, want: "runc"},
		{name: "optional missing is not a failure", sys: fakeSys{missing: map[string]bool{"runsc": true}, noKVM: true},
			wantCode: 0, want: "missing (optional)"},
		{name: "required missing fails with the fix", sys: fakeSys{missing: map[string]bool{"runc": true}},
			wantCode: 1, want: "fix: apt-get install runc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// No server at this address: doctor works without one.
			r := (&cliRun{sys: tt.sys}).run(t, "http://127.0.0.1:1", "doctor")
			if r.code != tt.wantCode || !strings.Contains(r.stdout, tt.want) {
				t.Errorf("exit %d stdout:\n%s\nstderr %q", r.code, r.stdout, r.stderr)
			}
			if !strings.Contains(r.stdout, "not answering") {
				t.Errorf("doctor should report the server as not answering:\n%s", r.stdout)
			}
		})
	}
	r := (&cliRun{sys: fakeSys{missing: map[string]bool{"nft": true}}}).run(t, "http://127.0.0.1:1", "-o", "json", "doctor", "--no-server")
	var checks []check
	if err := json.Unmarshal([]byte(r.stdout), &checks); err != nil || r.code != 0 {
		t.Fatalf("json: %v %q", err, r.stdout)
	}
	if c := findCheck(t, checks, "nft (network allowlists)"); c.Status != checkMissing || c.Required {
		t.Errorf("nft check = %+v", c)
	}
	for _, c := range checks {
		if c.Name == "server" {
			t.Error("--no-server still asked the server")
		}
	}
}
