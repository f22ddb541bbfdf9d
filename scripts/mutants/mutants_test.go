// Package mutants holds the check of the engine's mutant list
// (scripts/mutants-delivery.tsv, run by scripts/mutate-delivery.sh): a
// mutant that no longer applies to the code, or that names tests which no
// longer exist, fails here rather than being reported stale by a run no one
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
			dir, pattern := "executor", run
			if p, rest, ok := strings.Cut(run, ":"); ok {
				dir, pattern = strings.Trim(p, "./"), rest
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
