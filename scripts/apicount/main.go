// Command apicount counts the exported names of capstan's public packages —
// types, functions, constants, variables and the exported methods of exported
// types, as go doc -all lists them — prints the count per package, and fails
// when the total is over the budget: a surface a team can hold in its head.
// It also fails when an exported declaration of a public package names a type
// or value of an internal package: Go allows it, but a user cannot name such a
// type, so the public API would show what no user can write.
//
// Usage: go run ./scripts/apicount [-budget N] [-list]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// publicDirs are what a user imports: every package outside cmd/, examples/,
// scripts/, the benchmarks module and internal/.
func publicDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if rel == "." {
			dirs = append(dirs, path)
			return nil
		}
		switch first, _, _ := strings.Cut(filepath.ToSlash(rel), "/"); {
		case first == "cmd", first == "examples", first == "scripts", first == "benchmarks", first == "clients",
			d.Name() == "internal", d.Name() == "testdata", strings.HasPrefix(d.Name(), "."), d.Name() == "node_modules":
			return filepath.SkipDir
		}
		dirs = append(dirs, path)
		return nil
	})
	return dirs, err
}

// count returns the package name and exported names of the package in dir
// ("" for a directory without a library package), and the exported
// declarations that name an internal package.
func count(dir string) (string, []string, []string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", nil, nil, err
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return "", nil, nil, err
		}
		files = append(files, f)
	}
	if len(files) == 0 || files[0].Name.Name == "main" {
		return "", nil, nil, nil
	}
	exportedType := map[string]bool{}
	for _, f := range files {
		for _, d := range f.Decls {
			if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.TYPE {
				for _, s := range g.Specs {
					if ts := s.(*ast.TypeSpec); ts.Name.IsExported() {
						exportedType[ts.Name.Name] = true
					}
				}
			}
		}
	}
	var names []string
	var leaks []string
	for _, f := range files {
		internal := internalImports(f)
		leak := func(name string, nodes ...ast.Node) {
			if path := namesInternal(internal, nodes...); path != "" {
				leaks = append(leaks, fmt.Sprintf("%s: %s names %s", fset.Position(f.Package).Filename, name, path))
			}
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Name.IsExported() && (d.Recv == nil || exportedType[receiverType(d.Recv.List[0].Type)]) {
					name := d.Name.Name
					if d.Recv != nil {
						name = receiverType(d.Recv.List[0].Type) + "." + name
					}
					names = append(names, name)
					leak(d.Name.Name, d.Type)
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					switch s := s.(type) {
					case *ast.TypeSpec:
						if s.Name.IsExported() {
							names = append(names, s.Name.Name)
							leak(s.Name.Name, exportedParts(s)...)
						}
					case *ast.ValueSpec:
						for _, id := range s.Names {
							if id.IsExported() {
								names = append(names, id.Name)
								leak(id.Name, s.Type)
							}
						}
					}
				}
			}
		}
	}
	return files[0].Name.Name, names, leaks, nil
}

// internalImports maps the names a file imports internal packages under to
// their paths.
func internalImports(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, imp := range f.Imports {
		path := strings.Trim(imp.Path.Value, `"`)
		if !strings.Contains("/"+path+"/", "/internal/") {
			continue
		}
		name := path[strings.LastIndex(path, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		m[name] = path
	}
	return m
}

// exportedParts are the parts of a type declaration its users see: the
// exported fields of a struct, the exported methods and embedded types of an
// interface, the whole of any other type.
func exportedParts(s *ast.TypeSpec) []ast.Node {
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return []ast.Node{s.TypeParams, s.Type}
	}
	parts := []ast.Node{s.TypeParams}
	for _, fld := range fields.List {
		exported := len(fld.Names) == 0 // embedded
		for _, id := range fld.Names {
			exported = exported || id.IsExported()
		}
		if exported {
			parts = append(parts, fld.Type)
		}
	}
	return parts
}

// namesInternal returns the path of the first internal package the nodes
// name, or "".
func namesInternal(internal map[string]string, nodes ...ast.Node) string {
	found := ""
	for _, n := range nodes {
		if n == nil || n == (*ast.FieldList)(nil) || found != "" {
			continue
		}
		ast.Inspect(n, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok && found == "" {
				if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" {
					found = internal[id.Name]
				}
			}
			return found == ""
		})
	}
	return found
}

func receiverType(e ast.Expr) string {
	for {
		switch t := e.(type) {
		case *ast.StarExpr:
			e = t.X
		case *ast.IndexExpr:
			e = t.X
		case *ast.IndexListExpr:
			e = t.X
		case *ast.Ident:
			return t.Name
		default:
			return ""
		}
	}
}

func main() {
	budget := flag.Int("budget", 0, "fail when the public packages export more names than this (0: only print)")
	list := flag.Bool("list", false, "print every name under its package's count")
	flag.Parse()
	dirs, err := publicDirs(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	type row struct {
		dir   string
		n     int
		names []string
	}
	var rows []row
	var leaks []string
	total := 0
	for _, d := range dirs {
		name, names, l, err := count(d)
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(2)
		}
		if name == "" {
			continue
		}
		rows = append(rows, row{d, len(names), names})
		leaks = append(leaks, l...)
		total += len(names)
	}
	sort.Slice(rows, func(i, j int) bool {
		return rows[i].n > rows[j].n || rows[i].n == rows[j].n && rows[i].dir < rows[j].dir
	})
	for _, r := range rows {
		fmt.Printf("%5d  %s\n", r.n, filepath.ToSlash(r.dir))
		if *list {
			sort.Strings(r.names)
			for _, n := range r.names {
				fmt.Printf("       %s\n", n)
			}
		}
	}
	fmt.Printf("%5d  exported names in all\n", total)
	if len(leaks) > 0 {
		fmt.Fprintln(os.Stderr, "apicount: exported declarations name internal packages, whose types a user cannot write:")
		for _, l := range leaks {
			fmt.Fprintln(os.Stderr, "\t"+l)
		}
		os.Exit(1)
	}
	if *budget > 0 && total > *budget {
		fmt.Fprintf(os.Stderr, "apicount: %d exported names, over the budget of %d: move what only capstan's own packages need under internal/\n", total, *budget)
		os.Exit(1)
	}
}
