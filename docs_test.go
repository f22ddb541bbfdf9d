package capstan_test

import (
	"bufio"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// designWordBudget is the most words docs/design.md may hold: what someone
// changing the engine must know, not a history of it. Explanations of one
// rule belong in the doc comment next to it; figures in docs/performance.md.
const designWordBudget = 10000

// changelogBulletWords is the most words of one CHANGELOG line: a change as a
// user of the previous release would notice it, not its story.
const changelogBulletWords = 40

var (
	contentsRE = regexp.MustCompile(`^(\d+)\. \[([^\]]+)\]\(#([^)]+)\)$`)
	sectionRE  = regexp.MustCompile(`^## (\d+)\. (.+)$`)
	testNameRE = regexp.MustCompile("`(Test[A-Za-z0-9_]+)(\\*?)`")
	testFuncRE = regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(`)
)

func TestDesign_ContentsMatchTheSections(t *testing.T) {
	t.Parallel()
	var contents, sections []string
	for _, l := range lines(t, "docs/design.md") {
		if m := contentsRE.FindStringSubmatch(l); m != nil {
			if want := anchor(m[1] + ". " + m[2]); m[3] != want {
				t.Errorf("contents: %q links #%s, its heading's anchor is #%s", l, m[3], want)
			}
			contents = append(contents, m[1]+". "+m[2])
		}
		if m := sectionRE.FindStringSubmatch(l); m != nil {
			sections = append(sections, m[1]+". "+m[2])
		}
	}
	if len(sections) == 0 {
		t.Fatal("docs/design.md has no numbered section")
	}
	if strings.Join(contents, "\n") != strings.Join(sections, "\n") {
		t.Errorf("the contents list\n\t%s\nthe sections are\n\t%s",
			strings.Join(contents, "\n\t"), strings.Join(sections, "\n\t"))
	}
	for i, s := range sections {
		if want := itoa(i + 1); !strings.HasPrefix(s, want+". ") {
			t.Errorf("section %q is numbered out of turn: want §%s here", s, want)
		}
	}
}

func TestDesign_WithinItsWordBudget(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(string(data))); n > designWordBudget {
		t.Errorf("docs/design.md holds %d words, over its budget of %d: move what explains one rule into that rule's doc comment, figures to docs/performance.md", n, designWordBudget)
	}
}

// The tests the design says prove a rule exist under those names (a name
// ending in * is a prefix).
func TestDesign_NamedTestsExist(t *testing.T) {
	t.Parallel()
	declared := map[string]bool{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range testFuncRE.FindAllStringSubmatch(string(data), -1) {
			declared[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	named := testNameRE.FindAllStringSubmatch(string(data), -1)
	if len(named) == 0 {
		t.Fatal("docs/design.md names no test")
	}
	for _, m := range named {
		if m[2] == "" && !declared[m[1]] {
			t.Errorf("docs/design.md names %s, which no _test.go declares", m[1])
		}
		if m[2] == "*" && !anyWithPrefix(declared, m[1]) {
			t.Errorf("docs/design.md names %s*, and no test begins so", m[1])
		}
	}
}

// Every version of the CHANGELOG lists its changes under Added, Changed,
// Fixed and Removed, one line each.
func TestChangelog_OneLinePerChangeUnderFourHeadings(t *testing.T) {
	t.Parallel()
	allowed := map[string]bool{"Added": true, "Changed": true, "Fixed": true, "Removed": true}
	version, group := "", ""
	seen := map[string]bool{}
	bullets := 0
	for i, l := range lines(t, "CHANGELOG.md") {
		at := "CHANGELOG.md:" + itoa(i+1)
		switch {
		case strings.HasPrefix(l, "## "):
			version, group = l, ""
			seen = map[string]bool{}
			if !strings.HasPrefix(l, "## [") {
				version = "" // Compatibility: prose, not changes
			}
		case strings.HasPrefix(l, "### "):
			group = strings.TrimPrefix(l, "### ")
			if version == "" || !allowed[group] {
				t.Errorf("%s: %q: a version's changes go under Added, Changed, Fixed or Removed", at, l)
			}
			if seen[group] {
				t.Errorf("%s: %s appears twice under %s", at, group, version)
			}
			seen[group] = true
		case version == "" || group == "" || l == "":
		case !strings.HasPrefix(l, "- "):
			t.Errorf("%s: a change is one line beginning \"- \": %q", at, l)
		default:
			bullets++
			if n := len(strings.Fields(l)) - 1; n > changelogBulletWords {
				t.Errorf("%s: %d words, over %d: say what a user notices, once", at, n, changelogBulletWords)
			}
		}
	}
	if bullets == 0 {
		t.Error("CHANGELOG.md lists no change")
	}
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ls []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		ls = append(ls, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return ls
}

// anchor is GitHub's anchor of a heading: lower case, spaces as hyphens,
// punctuation dropped.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anyWithPrefix(set map[string]bool, prefix string) bool {
	for name := range set {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

func itoa(n int) string { return strconv.Itoa(n) }
