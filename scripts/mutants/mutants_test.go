// Package mutants holds the check of the engine's mutant list
// (scripts/mutants-delivery.tsv, run by scripts/mutate-delivery.sh): a
// mutant that no longer applies to the code, that names tests which no
// longer exist, or whose first test is not a unit test of its own file's
// package, fails here rather than being reported stale by a run no one
// reads.
package mutants

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const list = "../mutants-delivery.tsv"

// mutant is one line of the list.
type mutant struct {
	line                   int
	id, file, tests        string
	text, replacement, why string
}

func readList(t *testing.T) []mutant {
	t.Helper()
	f, err := os.Open(list)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ms []mutant
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, "\t")
		if len(fields) != 6 {
			t.Errorf("%s:%d: %d fields, want 6 (id, file, tests, text, replacement, what it breaks)", list, n, len(fields))
			continue
		}
		ms = append(ms, mutant{line: n, id: fields[0], file: fields[1], tests: fields[2],
			text: fields[3], replacement: fields[4], why: fields[5]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ms
}

// unescape reads a text of the list as scripts/mutate-delivery.sh does.
func unescape(s string) string {
	return strings.NewReplacer(`\n`, "\n", `\t`, "\t").Replace(s)
}

// Every mutant's text occurs exactly once in its file, as many parts as
// its replacement has, and its ids are unique: the run applies each one.
func TestMutants_ApplyToTheCode(t *testing.T) {
	ms := readList(t)
	if len(ms) == 0 {
		t.Fatal("no mutants listed")
	}
	ids := map[string]int{}
	for _, m := range ms {
		if prev, dup := ids[m.id]; dup {
			t.Errorf("%s: listed on lines %d and %d", m.id, prev, m.line)
		}
		ids[m.id] = m.line
		src, err := os.ReadFile(filepath.Join("..", "..", m.file))
		if err != nil {
			t.Errorf("%s: %v", m.id, err)
			continue
		}
		texts, repls := strings.Split(m.text, `\&`), strings.Split(m.replacement, `\&`)
		if len(texts) != len(repls) {
			t.Errorf("%s: %d texts and %d replacements", m.id, len(texts), len(repls))
		}
		for _, text := range texts {
			if n := strings.Count(string(src), unescape(text)); n != 1 {
				t.Errorf("%s (%s): its text occurs %d times in %s, want once: %q", m.id, m.why, n, m.file, text)
			}
		}
		if m.why == "" {
			t.Errorf("%s: does not say what it breaks", m.id)
		}
	}
}

// equivalent marks a mutant that changes no behaviour: what it breaks
// begins so, and says why nothing breaks.
const equivalent = "equivalent: "

// Every mutant that is not equivalent names a test of its own file's
// package first: the unit test named after the rule it breaks, which kills
// it without the executor's black-box tests (the run tries it first). An
// equivalent one says why it is.
func TestMutants_NameAUnitTestOfTheirOwnPackageFirst(t *testing.T) {
	for _, m := range readList(t) {
		if why, ok := strings.CutPrefix(m.why, equivalent); ok {
			if len(strings.TrimSpace(why)) < 20 {
				t.Errorf("%s: marked equivalent without saying why", m.id)
			}
			continue
		}
		first, _, _ := strings.Cut(m.tests, ";")
		if dir, own := runDir(first), filepath.Dir(m.file); dir != own {
			t.Errorf("%s (%s): its first tests are %s's, want a unit test of %s, named after its rule", m.id, m.why, dir, own)
		}
	}
}

// runDir is the package directory of one run of a mutant's tests
// ("./path/:pattern"; the executor's without a path).
func runDir(run string) string {
	if p, _, ok := strings.Cut(run, ":"); ok {
		return strings.Trim(p, "./")
	}
	return "executor"
}

var testFunc = regexp.MustCompile(`(?m)^func (Test\w+)\(`)

// Every alternative of a mutant's test patterns names at least one test of
// its package: a renamed or deleted test would let the mutant live unseen.
func TestMutants_NameTestsThatExist(t *testing.T) {
	tests := map[string][]string{} // package directory → its tests
	testsOf := func(dir string) []string {
		if names, ok := tests[dir]; ok {
			return names
		}
		files, err := filepath.Glob(filepath.Join("..", "..", dir, "*_test.go"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range testFunc.FindAllSubmatch(src, -1) {
				names = append(names, string(m[1]))
			}
		}
		tests[dir] = names
		return names
	}
	for _, m := range readList(t) {
		for run := range strings.SplitSeq(m.tests, ";") {
			dir, pattern := runDir(run), run
			if _, rest, ok := strings.Cut(run, ":"); ok {
				pattern = rest
			}
			names := testsOf(dir)
			if len(names) == 0 {
				t.Errorf("%s: %s has no tests", m.id, dir)
				continue
			}
			for alt := range strings.SplitSeq(pattern, "|") {
				re, err := regexp.Compile(alt)
				if err != nil {
					t.Errorf("%s: pattern %q: %v", m.id, alt, err)
					continue
				}
				found := false
				for _, name := range names {
					if re.MatchString(name) {
						found = true
						break
					}
				}
				if !found {
					t.Errorf("%s: no test of %s matches %q", m.id, dir, alt)
				}
			}
		}
	}
}
