package template

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestToolOutputCondenses(t *testing.T) {
	log, err := os.ReadFile("testdata/debootstrap.log")
	if err != nil {
		t.Fatal(err)
	}
	var w strings.Builder
	o := &toolOutput{p: newProgress(&w), prefix: "debootstrap"}
	// Odd write boundaries, as a pipe delivers them.
	for i := 0; i < len(log); i += 7 {
		end := min(i+7, len(log))
		o.Write(log[i:end])
	}
	o.Close()
	elapsed := regexp.MustCompile(`(?m)^\[ *[0-9.]+s\] `)
	got := elapsed.ReplaceAllString(w.String(), "")
	want := `debootstrap: Retrieving InRelease
debootstrap: Checking Release signature
debootstrap: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)
debootstrap: Retrieving Packages
debootstrap: … 2× retrieving
debootstrap: Resolving dependencies of required packages
debootstrap: … 2× resolving
debootstrap: Checking component main on http://mirror.example/debian
debootstrap: Retrieving adduser 3.134
debootstrap: … 4× retrieving
debootstrap: Chosen extractor for .deb packages: dpkg-deb
debootstrap: Extracting adduser
debootstrap: … 2× extracting
debootstrap: Installing core packages
debootstrap: Unpacking required packages
debootstrap: … 3× unpacking
debootstrap: Configuring required packages
debootstrap: … 2× configuring
debootstrap: Base system installed successfully.
`
	if got != want {
		t.Errorf("condensed output:\n%s\nwant:\n%s", got, want)
	}
	if !elapsed.MatchString(w.String()) {
		t.Error("progress lines have no elapsed time")
	}
	tail := o.Tail()
	if !strings.HasSuffix(tail, "Setting up adduser (3.134) ...\nI: Base system installed successfully.") {
		t.Errorf("tail misses the last lines:\n%s", tail)
	}
}
