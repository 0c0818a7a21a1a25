package nodump

import "testing"

// TestNonDumpable: importing the package made this process non-dumpable
// (the test binary imports it like the agent does).
func TestNonDumpable(t *testing.T) {
	d, err := Dumpable()
	if err != nil {
		t.Fatal(err)
	}
	if d {
		t.Fatal("the process is dumpable after the package's init")
	}
	if err := set(); err != nil {
		t.Errorf("set again: %v", err)
	}
}
