// Command doccheck fails when an exported identifier of a public package of
// the module has no doc comment, or a public package has no package comment
// with an example in it.
// A public package is one an importer can use: not under internal/, not a
// command, not under examples/, benchmarks/ or scripts/. Grouped constants
// and variables are covered by their group's comment, as go doc shows them.
//
// The exported fields of an exported struct type and the exported methods of
// an exported interface type are identifiers go doc shows too: each needs a
// doc comment (above it) or a line comment (after it on its line). Fields
// named together (A, B int) share their comment. Struct and interface types
// written inline (a field of type struct{ ... }) are checked the same way,
// to any depth. An embedded field or interface is not checked: it names a
// type, and that type's own comment documents it (an embedded exported type
// is checked where it is declared; an embedded unexported one is not shown
// by go doc).
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
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Module.Path}} {{.Name}} {{.Dir}}", "./...").Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w", err)
	}
	var pkgs []pkg
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) != 4 || f[2] == "main" || !public(f[0], f[1]) {
			continue
		}
		pkgs = append(pkgs, pkg{f[0], f[3]})
	}
	return pkgs, sc.Err()
}

// public reports whether the import path of a package of module is one a
// user imports: none of its elements is internal, and it is not an example,
// a benchmark or a script of the repository.
func public(importPath, module string) bool {
	if slices.Contains(strings.Split(importPath, "/"), "internal") {
		return false
	}
	rel := strings.TrimPrefix(importPath, module+"/")
	for _, d := range []string{"examples", "benchmarks", "scripts"} {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return false
		}
	}
	return true
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
		for _, spec := range t.Decl.Specs {
			if ts, ok := spec.(*ast.TypeSpec); ok && ts.Name.Name == t.Name {
				members(ts.Type, t.Name, miss)
			}
		}
		values(t.Consts)
		values(t.Vars)
		funcs(t.Funcs, "")
		funcs(t.Methods, t.Name)
	}
	return missing, nil
}

// members reports, through miss, the exported fields of the struct types and
// the exported methods of the interface types written in the type expression
// x (a named type's definition, or a field's type inside it) that have neither
// a doc comment nor a line comment. Embedded fields are not reported (see the
// command's comment).
func members(x ast.Expr, path string, miss func(token.Pos, string)) {
	var list *ast.FieldList
	switch x := x.(type) {
	case *ast.StructType:
		list = x.Fields
	case *ast.InterfaceType:
		list = x.Methods
	case *ast.StarExpr:
		members(x.X, path, miss)
	case *ast.ArrayType:
		members(x.Elt, path, miss)
	case *ast.MapType:
		members(x.Key, path, miss)
		members(x.Value, path, miss)
	case *ast.ChanType:
		members(x.Value, path, miss)
	case *ast.ParenExpr:
		members(x.X, path, miss)
	}
	if list == nil {
		return
	}
	for _, f := range list.List {
		if len(f.Names) == 0 {
			continue // embedded
		}
		documented := f.Doc.Text() != "" || f.Comment.Text() != ""
		for _, n := range f.Names {
			if !n.IsExported() {
				continue
			}
			if !documented {
				miss(n.Pos(), path+"."+n.Name)
			}
			members(f.Type, path+"."+n.Name, miss)
		}
	}
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
