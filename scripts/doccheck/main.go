// Command doccheck fails when an exported identifier of a public package of
// the module has no doc comment, or a public package has no package comment
// with an example in it.
// A public package is one an importer can use: not under internal/, not a
// command. Grouped constants and variables are covered by their group's
// comment, as go doc shows them.
//
//	go run ./scripts/doccheck
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/doc"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	pkgs, err := publicPackages()
	if err != nil {
		fmt.Fprintln(os.Stderr, "doccheck:", err)
		os.Exit(2)
	}
	var missing []string
	for _, p := range pkgs {
		m, err := check(p.importPath, p.dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, "doccheck:", err)
			os.Exit(2)
		}
		missing = append(missing, m...)
	}
	for _, m := range missing {
		fmt.Println(m)
	}
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "doccheck: %d exported identifiers without a doc comment\n", len(missing))
		os.Exit(1)
	}
}

type pkg struct{ importPath, dir string }

// publicPackages lists the module's importable packages.
func publicPackages() ([]pkg, error) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Name}} {{.Dir}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 3)
		if len(f) != 3 || f[1] == "main" || slices.Contains(strings.Split(f[0], "/"), "internal") {
			continue
		}
		pkgs = append(pkgs, pkg{f[0], f[2]})
	}
	return pkgs, sc.Err()
}

// check returns the undocumented exported identifiers of the package in dir.
func check(importPath, dir string) ([]string, error) {
	wd, _ := os.Getwd()
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		if !buildsSomewhere(f) {
			continue
		}
		files = append(files, f)
	}
	if len(files) == 0 {
		return nil, nil
	}
	p, err := doc.NewFromFiles(fset, files, importPath)
	if err != nil {
		return nil, err
	}
	var missing []string
	miss := func(pos token.Pos, what string) {
		at := fset.Position(pos)
		if rel, err := filepath.Rel(wd, at.Filename); err == nil {
			at.Filename = rel
		}
		missing = append(missing, fmt.Sprintf("%s: %s has no doc comment", at, what))
	}
	reldir := dir
	if rel, err := filepath.Rel(wd, dir); err == nil {
		reldir = rel
	}
	switch {
	case strings.TrimSpace(p.Doc) == "":
		missing = append(missing, fmt.Sprintf("%s: package %s has no package comment", reldir, p.Name))
	case !hasCode(p.Parser().Parse(p.Doc)):
		missing = append(missing, fmt.Sprintf("%s: package %s's comment shows no example (an indented code block)", reldir, p.Name))
	}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			if v.Doc != "" {
				continue
			}
			for _, spec := range v.Decl.Specs {
				vs := spec.(*ast.ValueSpec)
				if vs.Doc != nil || vs.Comment != nil {
					continue
				}
				for _, n := range vs.Names {
					if n.IsExported() {
						miss(n.Pos(), n.Name)
					}
				}
			}
		}
	}
	funcs := func(fs []*doc.Func, recv string) {
		for _, f := range fs {
			if f.Doc == "" {
				name := f.Name
				if recv != "" && f.Recv != "" {
					name = recv + "." + name
				}
				miss(f.Decl.Pos(), name)
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	funcs(p.Funcs, "")
	for _, t := range p.Types {
		if t.Doc == "" {
			miss(t.Decl.Pos(), t.Name)
		}
		values(t.Consts)
		values(t.Vars)
		funcs(t.Funcs, "")
		funcs(t.Methods, t.Name)
	}
	return missing, nil
}

// hasCode reports whether a doc comment holds a code block.
func hasCode(d *comment.Doc) bool {
	for _, b := range d.Content {
		if _, ok := b.(*comment.Code); ok {
			return true
		}
	}
	return false
}

// buildsSomewhere drops files that never build (//go:build ignore).
func buildsSomewhere(f *ast.File) bool {
	for _, cg := range f.Comments {
		if cg.Pos() > f.Package {
			break
		}
		for _, c := range cg.List {
			if strings.HasPrefix(c.Text, "//go:build ignore") {
				return false
			}
		}
	}
	return true
}
