package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheck_FieldsAndInterfaceMethods runs check on a package written to a
// temporary directory and compares the identifiers it reports with the ones
// that are undocumented.
func TestCheck_FieldsAndInterfaceMethods(t *testing.T) {
	t.Parallel()
	const head = "// Package p is a package.\n//\n//\tp.T{}\npackage p\n\n"
	cases := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "an undocumented field of an exported struct",
			src: `// T is a type.
type T struct {
	A int
}`,
			want: []string{"T.A"},
		},
		{
			name: "doc comments and line comments document a field",
			src: `// T is a type.
type T struct {
	// A is documented above.
	A int
	B int // B is documented on its line.
}`,
		},
		{
			name: "names declared together share a comment, and are reported together",
			src: `// T is a type.
type T struct {
	A, B int // A and B share this.
	C, D int
}`,
			want: []string{"T.C", "T.D"},
		},
		{
			name: "a directive or an empty comment documents nothing",
			src: `// T is a type.
type T struct {
	//go:fix inline
	A int
	B int //
}`,
			want: []string{"T.A", "T.B"},
		},
		{
			name: "unexported fields and embedded fields are not reported",
			src: `// T is a type.
type T struct {
	E
	*F
	a int
}

// E is embedded.
type E struct{}

// F is embedded.
type F struct{}`,
		},
		{
			name: "fields of an unexported struct type are not reported",
			src: `type t struct {
	A int
}

// New returns a t.
func New() any { return t{} }`,
		},
		{
			name: "fields of inline struct types are checked at any depth",
			src: `// T is a type.
type T struct {
	// A is documented, its own fields are not all.
	A struct {
		B int // B is documented.
		C []*struct {
			D int
		}
	}
	M map[string]struct{ E int } // M is documented.
}`,
			want: []string{"T.A.C", "T.A.C.D", "T.M.E"},
		},
		{
			name: "methods of an exported interface type",
			src: `// I is an interface.
type I interface {
	// Do is documented.
	Do()
	Undone() error
	J
	unexported()
}

// J is embedded.
type J interface{ Done() bool }`,
			want: []string{"I.Undone", "J.Done"},
		},
		{
			name: "a type of a group is checked like one declared alone",
			src: `type (
	// T is a type.
	T struct {
		A int
	}
	// U is a type.
	U struct {
		B int // B is documented.
	}
)`,
			want: []string{"T.A"},
		},
		{
			name: "the fields of a generic struct type",
			src: `// G is generic.
type G[X any] struct {
	V X
}`,
			want: []string{"G.V"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(head+c.src+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			missing, err := check("example.com/p", dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range missing {
				// file:line:col: NAME has no doc comment
				_, rest, ok := strings.Cut(m, ": ")
				name, found := strings.CutSuffix(rest, " has no doc comment")
				if !ok || !found {
					t.Fatalf("unexpected report %q", m)
				}
				got = append(got, name)
			}
			slices.Sort(got)
			want := slices.Clone(c.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("reported %q, want %q", got, want)
			}
		})
	}
}

// TestCheck_ReportsLineOfField checks that a report points at the field's
// own line, where an editor can jump to it.
func TestCheck_ReportsLineOfField(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := "// Package p is a package.\n//\n//\tp.T{}\npackage p\n\n// T is a type.\ntype T struct {\n\tA int // A is documented.\n\tB int\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	missing, err := check("example.com/p", dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || !strings.HasSuffix(missing[0], "p.go:9:2: T.B has no doc comment") {
		t.Errorf("reported %q, want one report of T.B at p.go:9:2", missing)
	}
}

// TestPublic keeps the package rules: what is internal, or an example, a
// benchmark or a script of the repository, is not checked.
func TestPublic(t *testing.T) {
	t.Parallel()
	const mod = "example.com/m"
	for path, want := range map[string]bool{
		mod:                          true,
		mod + "/executor":            true,
		mod + "/telemetry/otlp":      true,
		mod + "/internal/delivery":   false,
		mod + "/executor/internal/x": false,
		mod + "/examples/hello":      false,
		mod + "/benchmarks/cmp":      false,
		mod + "/scripts/doccheck":    false,
		mod + "/examplesque":         true,
		mod + "/docs/scripts":        true,
	} {
		if got := public(path, mod); got != want {
			t.Errorf("public(%q) = %v, want %v", path, got, want)
		}
	}
}
