// Command linkcheck fails when a relative link of the README, the CHANGELOG
// or a page under docs/ names a file that does not exist, or a heading that
// the Markdown page it names does not have (GitHub's anchors: lower case,
// punctuation dropped, spaces as hyphens). Links inside fenced code blocks
// and links with a scheme (https:, mailto:) are not checked.
//
//	go run ./scripts/linkcheck
package main

import (
	"bufio"
	"fmt"
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
