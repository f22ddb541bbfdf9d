// Command linkcheck fails when a relative link of the README, the CHANGELOG
// or a page under docs/ names a file that does not exist, or a heading that
// the Markdown page it names does not have (GitHub's anchors: lower case,
// punctuation dropped, spaces as hyphens). Links inside fenced code blocks
// and links with a scheme (https:, mailto:) are not checked.
//
// It fails too when a "§n" of the design — in a Go comment ("DESIGN §5") or
// in docs/design.md itself — names no section "## n." of docs/design.md, or
// when a Go comment names a part of a section (§12 "Quotas", §3 *Queues*)
// that the section does not have.
//
//	go run ./scripts/linkcheck
package main

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6} (.*)$`)
	schemeRE  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	inlineRE  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	sectionRE = regexp.MustCompile(`^## (\d+)\. `)
	refRE     = regexp.MustCompile(`§(\d+)`)
	partRE    = regexp.MustCompile(`§(\d+),? (?:"([^"]+)"|\*([^*]+)\*)`)
)

func main() {
	pages := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		fail(err)
	}
	pages = append(pages, docs...)
	anchors := map[string]map[string]bool{}
	broken := 0
	for _, page := range pages {
		links, err := linksOf(page)
		if err != nil {
			fail(err)
		}
		for _, l := range links {
			if schemeRE.MatchString(l.target) {
				continue
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := page
			if path != "" {
				target = filepath.Join(filepath.Dir(page), path)
			}
			if _, err := os.Stat(target); err != nil {
				fmt.Printf("%s:%d: %s: no such file\n", page, l.line, l.target)
				broken++
				continue
			}
			if anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			if anchors[target] == nil {
				if anchors[target], err = headingsOf(target); err != nil {
					fail(err)
				}
			}
			if !anchors[target][anchor] {
				fmt.Printf("%s:%d: %s: %s has no such heading\n", page, l.line, l.target, target)
				broken++
			}
		}
	}
	b, err := designRefs("docs/design.md")
	if err != nil {
		fail(err)
	}
	broken += b
	if broken > 0 {
		fmt.Fprintf(os.Stderr, "linkcheck: %d broken links\n", broken)
		os.Exit(1)
	}
}

type link struct {
	target string
	line   int
}

// linksOf returns the links of a Markdown page outside its code blocks.
func linksOf(page string) ([]link, error) {
	var links []link
	err := eachLine(page, func(n int, l string) {
		for _, m := range linkRE.FindAllStringSubmatch(l, -1) {
			links = append(links, link{m[1], n})
		}
	})
	return links, err
}

// headingsOf returns the anchors of a Markdown page's headings.
func headingsOf(page string) (map[string]bool, error) {
	hs := map[string]bool{}
	err := eachLine(page, func(_ int, l string) {
		if m := headingRE.FindStringSubmatch(l); m != nil {
			hs[slug(m[1])] = true
		}
	})
	return hs, err
}

// slug is GitHub's anchor of a heading.
func slug(h string) string {
	h = inlineRE.ReplaceAllString(h, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// eachLine calls fn with every line of a page outside fenced code blocks.
func eachLine(page string, fn func(n int, l string)) error {
	f, err := os.Open(page)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	fenced := false
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		if strings.HasPrefix(l, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			fn(n, l)
		}
	}
	return sc.Err()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "linkcheck:", err)
	os.Exit(2)
}

// designRefs prints and counts the references into the design that do not
// resolve: every §n of the design itself and of the repository's Go files
// (where § always means the design), and every quoted part of a section
// that a Go file names after its §n.
func designRefs(design string) (int, error) {
	sections := map[string]string{}
	current := ""
	err := eachLine(design, func(_ int, l string) {
		if m := sectionRE.FindStringSubmatch(l); m != nil {
			current = m[1]
		} else if strings.HasPrefix(l, "## ") {
			current = ""
		}
		if current != "" {
			sections[current] += strings.ToLower(l) + "\n"
		}
	})
	if err != nil {
		return 0, err
	}
	broken := 0
	check := func(file string, n int, l string) {
		for _, m := range refRE.FindAllStringSubmatch(l, -1) {
			if _, ok := sections[m[1]]; !ok {
				fmt.Printf("%s:%d: §%s: %s has no such section\n", file, n, m[1], design)
				broken++
			}
		}
		if !strings.HasSuffix(file, ".go") {
			return
		}
		for _, m := range partRE.FindAllStringSubmatch(l, -1) {
			part := m[2] + m[3]
			if text, ok := sections[m[1]]; ok && !strings.Contains(text, strings.ToLower(part)) {
				fmt.Printf("%s:%d: §%s %q: that section of %s does not say it\n", file, n, m[1], part, design)
				broken++
			}
		}
	}
	if err := eachLine(design, func(n int, l string) { check(design, n, l) }); err != nil {
		return 0, err
	}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || (strings.HasPrefix(d.Name(), ".") && path != ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, l := range strings.Split(string(data), "\n") {
			check(path, i+1, l)
		}
		return nil
	})
	return broken, err
}
