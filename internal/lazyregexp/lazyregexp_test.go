package lazyregexp

import (
	"sync"
	"testing"
)

func TestLazy(t *testing.T) {
	r := New(`^([a-z]+)-([0-9]{1,3})$`)
	if r.re != nil {
		t.Fatal("compiled before first use")
	}
	if r.String() != `^([a-z]+)-([0-9]{1,3})$` {
		t.Errorf("String() = %q", r.String())
	}
	if !r.MatchString("abc-12") || r.MatchString("abc-1234") || !r.Match([]byte("x-1")) {
		t.Error("MatchString/Match disagree with the expression")
	}
	if m := r.FindStringSubmatch("abc-12"); len(m) != 3 || m[1] != "abc" || m[2] != "12" {
		t.Errorf("FindStringSubmatch = %q", m)
	}
	if m := r.FindSubmatch([]byte("q-7")); len(m) != 3 || string(m[2]) != "7" {
		t.Errorf("FindSubmatch = %q", m)
	}
	first := r.Regexp()
	if again := r.Regexp(); again != first {
		t.Error("compiled twice")
	}
}

func TestConcurrentFirstUse(t *testing.T) {
	r := New(`^a+$`)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !r.MatchString("aaa") {
				t.Error("no match")
			}
		}()
	}
	wg.Wait()
}

func TestBadExpression(t *testing.T) {
	r := New(`(`)
	if r.Compile() == nil {
		t.Fatal("Compile accepted (")
	}
	defer func() {
		if recover() == nil {
			t.Error("a bad expression did not panic on first use")
		}
	}()
	r.MatchString("x")
}
