package engine

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The shape of the one pass (package doc), checked on the engine's own
// source: no type with more methods than a reader holds at once, calls
// between the delivery's files going one way, down the package doc's list,
// and the runner's parts and a delivery's state never reaching into each
// other.

// mostMethods is the most methods a type of the engine may have.
const mostMethods = 25

// engineSource is the engine's source, without its tests, type-checked on
// its own: what it imports is left unresolved, which is enough to tell the
// engine's own types, functions and methods apart.
type engineSource struct {
	fset  *token.FileSet
	files []*ast.File
	pkg   *types.Package
	info  *types.Info
}

// blankImporter gives every import as an empty package.
type blankImporter struct{}

func (blankImporter) Import(path string) (*types.Package, error) {
	p := types.NewPackage(path, filepath.Base(path))
	p.MarkComplete()
	return p, nil
}

func readEngine(t *testing.T) *engineSource {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	src := &engineSource{fset: token.NewFileSet(), info: &types.Info{
		Types: map[ast.Expr]types.TypeAndValue{}, Uses: map[*ast.Ident]types.Object{}, Defs: map[*ast.Ident]types.Object{},
	}}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(src.fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		src.files = append(src.files, f)
	}
	// Errors are what the blank imports leave unresolved; the engine's own
	// names resolve all the same.
	conf := types.Config{Importer: blankImporter{}, Error: func(error) {}}
	src.pkg, _ = conf.Check("engine", src.fset, src.files, src.info)
	if src.pkg.Scope().Lookup("delivery") == nil || src.pkg.Scope().Lookup("Runner") == nil {
		t.Fatal("the engine's types were not read")
	}
	return src
}

func (src *engineSource) fileOf(pos token.Pos) string {
	return filepath.Base(src.fset.Position(pos).Filename)
}

func TestShape_NoTypeHasMoreThan25Methods(t *testing.T) {
	t.Parallel()
	src := readEngine(t)
	scope := src.pkg.Scope()
	counted := 0
	for _, name := range scope.Names() {
		tn, ok := scope.Lookup(name).(*types.TypeName)
		if !ok || tn.IsAlias() {
			continue
		}
		// Declared and promoted methods, of the value and the pointer.
		n := types.NewMethodSet(types.NewPointer(tn.Type())).Len()
		if n > mostMethods {
			t.Errorf("%s has %d methods; at most %d", name, n, mostMethods)
		}
		if name == "execution" || name == "delivery" || name == "Runner" {
			if n < 10 {
				t.Errorf("%s has %d methods: not the engine read", name, n)
			}
			counted++
		}
	}
	if counted != 3 {
		t.Fatalf("counted %d of execution, delivery and Runner", counted)
	}
}

// deliveryFiles are the files the package doc lists, in its order.
func (src *engineSource) deliveryFiles(t *testing.T) []string {
	t.Helper()
	for _, f := range src.files {
		if f.Doc == nil || f.Name.Name != "engine" || src.fileOf(f.Pos()) != "doc.go" {
			continue
		}
		var files []string
		for _, m := range regexp.MustCompile(`(?m)^\s*- ([a-z_]+\.go):`).FindAllStringSubmatch(f.Doc.Text(), -1) {
			files = append(files, m[1])
		}
		return files
	}
	t.Fatal("no package doc in doc.go")
	return nil
}

// calls are the calls from one file of the engine to a function or method
// of another, as "from -> to" with the functions' names.
func (src *engineSource) calls() map[[2]string][]string {
	calls := map[[2]string][]string{}
	for _, f := range src.files {
		from := src.fileOf(f.Pos())
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				var id *ast.Ident
				switch e := call.Fun.(type) {
				case *ast.Ident:
					id = e
				case *ast.SelectorExpr:
					id = e.Sel
				case *ast.IndexExpr:
					id, _ = e.X.(*ast.Ident)
				}
				if id == nil {
					return true
				}
				callee, ok := src.info.Uses[id].(*types.Func)
				if !ok || callee.Pkg() != src.pkg {
					return true
				}
				if to := src.fileOf(callee.Pos()); to != from {
					k := [2]string{from, to}
					calls[k] = append(calls[k], fn.Name.Name+" calls "+callee.Name())
				}
				return true
			})
		}
	}
	return calls
}

// A delivery goes down the files the package doc lists and back up by
// returning, never by a call back into a file above; and no file of the
// engine calls into one that calls it, directly or not.
func TestShape_CallsGoDownTheFilesOfADelivery(t *testing.T) {
	t.Parallel()
	src := readEngine(t)
	order := src.deliveryFiles(t)
	if len(order) < 8 || order[0] != "runner.go" || !slices.Contains(order, "delivery.go") {
		t.Fatalf("the package doc lists %v; want the delivery's files from runner.go down", order)
	}
	calls := src.calls()
	next := map[string][]string{}
	for k, how := range calls {
		next[k[0]] = append(next[k[0]], k[1])
		i, j := slices.Index(order, k[0]), slices.Index(order, k[1])
		if i >= 0 && j >= 0 && j < i {
			t.Errorf("%s calls up into %s: %v", k[0], k[1], how)
		}
	}
	if len(calls[[2]string{"runner.go", "delivery.go"}]) == 0 || len(calls[[2]string{"delivery.go", "takeover.go"}]) == 0 {
		t.Fatalf("calls read: %v; want runner.go's into delivery.go and delivery.go's into takeover.go", calls)
	}
	// No cycle among all the files, the listed and the others.
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var visit func(f string, path []string)
	visit = func(f string, path []string) {
		switch state[f] {
		case open:
			t.Errorf("files call each other in a circle: %s", strings.Join(append(path, f), " -> "))
			return
		case done:
			return
		}
		state[f] = open
		sort.Strings(next[f])
		for _, g := range next[f] {
			visit(g, append(path, f))
		}
		state[f] = done
	}
	var files []string
	for f := range next {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		visit(f, nil)
	}
}

// The runner's parts (its intake, the table of executions in flight, the
// counters, the worker's shared kit) and a delivery's state (the delivery,
// its execution, attempts, receipts, claim, lease keeper and trail) are
// separate types: no part of the runner names a delivery's state, in its
// fields or its methods, and no delivery's state names the Runner or its
// intake.
func TestShape_TheRunnersPartsAndADeliveryReachNotIntoEachOther(t *testing.T) {
	t.Parallel()
	src := readEngine(t)
	perDelivery := []string{"delivery", "execution", "attempts", "receipts", "claim", "leaseKeeper", "trail"}
	runnerParts := []string{"intake", "inflight", "stats", "worker", "store", "turns", "fairShare"}
	runner := []string{"Runner", "intake"}
	checked := 0
	for _, c := range []struct {
		types, mayNotName []string
	}{
		{runnerParts, append(slices.Clone(perDelivery), "Runner")},
		{perDelivery, runner},
	} {
		for _, name := range c.types {
			for _, what := range src.named(t, name) {
				if slices.Contains(c.mayNotName, what.typ) && what.typ != name {
					t.Errorf("%s names %s: %s", name, what.typ, what.where)
				}
			}
			checked++
		}
	}
	if checked != len(perDelivery)+len(runnerParts) {
		t.Fatalf("checked %d types", checked)
	}
}

// naming is a type of the engine named at where.
type naming struct{ typ, where string }

// named lists the engine's types that the type name's fields name, and
// those its methods' expressions have, directly or behind a pointer, slice,
// map, channel or function.
func (src *engineSource) named(t *testing.T, name string) []naming {
	t.Helper()
	tn, ok := src.pkg.Scope().Lookup(name).(*types.TypeName)
	if !ok {
		t.Fatalf("no type %s in the engine", name)
	}
	var found []naming
	add := func(typ types.Type, where string) {
		for _, n := range engineTypesIn(typ, src.pkg, map[types.Type]bool{}) {
			found = append(found, naming{n, where})
		}
	}
	if st, ok := tn.Type().Underlying().(*types.Struct); ok {
		for i := range st.NumFields() {
			add(st.Field(i).Type(), "field "+st.Field(i).Name())
		}
	}
	for _, f := range src.files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Body == nil {
				continue
			}
			recv := fn.Recv.List[0].Type
			if star, ok := recv.(*ast.StarExpr); ok {
				recv = star.X
			}
			if id, ok := recv.(*ast.Ident); !ok || id.Name != name {
				continue
			}
			ast.Inspect(fn, func(n ast.Node) bool {
				e, ok := n.(ast.Expr)
				if !ok {
					return true
				}
				if tv, ok := src.info.Types[e]; ok && tv.Type != nil {
					add(tv.Type, src.fset.Position(e.Pos()).String()+" in "+fn.Name.Name)
				}
				return true
			})
		}
	}
	return found
}

// engineTypesIn names the engine's named types that typ is or holds.
func engineTypesIn(typ types.Type, pkg *types.Package, seen map[types.Type]bool) []string {
	if seen[typ] {
		return nil
	}
	seen[typ] = true
	switch t := typ.(type) {
	case *types.Named:
		if t.Obj().Pkg() == pkg {
			return []string{t.Obj().Name()}
		}
	case *types.Pointer:
		return engineTypesIn(t.Elem(), pkg, seen)
	case *types.Slice:
		return engineTypesIn(t.Elem(), pkg, seen)
	case *types.Array:
		return engineTypesIn(t.Elem(), pkg, seen)
	case *types.Chan:
		return engineTypesIn(t.Elem(), pkg, seen)
	case *types.Map:
		return append(engineTypesIn(t.Key(), pkg, seen), engineTypesIn(t.Elem(), pkg, seen)...)
	case *types.Signature:
		var out []string
		for _, tuple := range []*types.Tuple{t.Params(), t.Results()} {
			for i := range tuple.Len() {
				out = append(out, engineTypesIn(tuple.At(i).Type(), pkg, seen)...)
			}
		}
		return out
	}
	return nil
}
