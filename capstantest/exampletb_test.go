package capstantest_test

import (
	"fmt"
	"os"
	"testing"
)

// exampleT stands in, in examples, for the *testing.T a test is given: an
// Example function has none. It runs cleanups at end, keeps temporary
// directories until then, and panics where a test would fail.
type exampleT struct {
	testing.TB
	cleanups []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                      {}
func (t *exampleT) Name() string                 { return "Example" }
func (t *exampleT) Cleanup(f func())             { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (t *exampleT) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (t *exampleT) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (t *exampleT) Logf(f string, args ...any)   {}

func (t *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "capstantest-example-")
	if err != nil {
		panic(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// end runs the cleanups, last registered first, as a test's end does.
func (t *exampleT) end() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}
