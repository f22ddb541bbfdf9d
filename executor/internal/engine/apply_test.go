package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// One pass (package doc): an action is acted on in one place, the switch
// of delivery.apply, which has a case for every action there is; no other
// switch of the engine names an action, and no package that uses the engine
// acts on one. A new action that apply does not carry out, or a second place
// that carries actions out, fails here.
func TestApply_TheOneSwitchOverActionsCoversEveryAction(t *testing.T) {
	t.Parallel()
	src := readEngine(t)
	fset, files := src.fset, src.files
	// The actions: the constants of type Do.
	var actions []string
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			typed := false
			for _, s := range g.Specs {
				v := s.(*ast.ValueSpec)
				if id, ok := v.Type.(*ast.Ident); ok {
					typed = id.Name == "Do"
				}
				if typed {
					for _, n := range v.Names {
						actions = append(actions, n.Name)
					}
				}
			}
		}
	}
	if len(actions) < len(doNames)-1 {
		t.Fatalf("found %d actions %v, want the %d doNames names", len(actions), actions, len(doNames)-1)
	}
	// Every switch whose cases name an action.
	type found struct {
		where string
		cases []string
	}
	var switches []found
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sw, ok := n.(*ast.SwitchStmt)
				if !ok {
					return true
				}
				var named []string
				for _, c := range sw.Body.List {
					for _, e := range c.(*ast.CaseClause).List {
						if id, ok := e.(*ast.Ident); ok && slices.Contains(actions, id.Name) {
							named = append(named, id.Name)
						}
					}
				}
				if len(named) > 0 {
					switches = append(switches, found{fset.Position(sw.Pos()).String() + " in " + fn.Name.Name, named})
				}
				return true
			})
		}
	}
	if len(switches) != 1 || !strings.HasSuffix(switches[0].where, " in apply") {
		t.Fatalf("switches over actions: %+v; want the one of delivery.apply", switches)
	}
	for _, a := range actions {
		if !slices.Contains(switches[0].cases, a) {
			t.Errorf("apply has no case for %s", a)
		}
	}
	// Nor does a package that uses the engine (the sweeper, the executor)
	// act on an action of its own: no case and no comparison names one.
	others, err := filepath.Glob("../sweeper/*.go")
	if err != nil {
		t.Fatal(err)
	}
	executor, err := filepath.Glob("../../*.go")
	if err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, name := range append(others, executor...) {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		read++
		ast.Inspect(f, func(n ast.Node) bool {
			var named []ast.Expr
			switch n := n.(type) {
			case *ast.CaseClause:
				named = n.List
			case *ast.BinaryExpr:
				named = []ast.Expr{n.X, n.Y}
			}
			for _, e := range named {
				if sel, ok := e.(*ast.SelectorExpr); ok && slices.Contains(actions, sel.Sel.Name) {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "engine" {
						t.Errorf("%s acts on engine.%s", fset.Position(sel.Pos()), sel.Sel.Name)
					}
				}
			}
			return true
		})
	}
	if read < 10 {
		t.Fatalf("read %d files of the sweeper and the executor", read)
	}
}
