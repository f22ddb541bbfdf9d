package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The examples of the README and docs/ are checked, so that none drifts from
// what capstan is: a Go block is the very lines of a test file that the Go
// suite compiles (and runs, for an Example with its output); a shell block is
// valid bash, and each capstan command in it names a command and flags that
// capstan has. The TypeScript blocks are type-checked by the TypeScript
// client's suite (clients/typescript/test/docs.test.ts), and the README's
// run against a capstan dev by its install test.

// docPages are the pages whose examples are checked.
func docPages(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join("..", "..", "README.md")}, pages...)
}

// fencedBlocks returns the fenced blocks of page whose info string is lang,
// each as its lines.
func fencedBlocks(t *testing.T, page, lang string) [][]string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	var cur []string
	in, want := false, false
	for l := range strings.SplitSeq(string(b), "\n") {
		switch {
		case !in && strings.HasPrefix(l, "```"):
			in, want, cur = true, strings.TrimPrefix(l, "```") == lang, nil
		case in && strings.HasPrefix(l, "```"):
			in = false
			if want {
				blocks = append(blocks, cur)
			}
		case in:
			cur = append(cur, l)
		}
	}
	return blocks
}

// goBlockHomes are the test files a page's Go blocks are taken from.
var goBlockHomes = []string{
	"executor/example_test.go",       // the README's first example
	"telemetry/otlp/example_test.go", // operations.md: metrics and traces
}

// Every Go block of the README and docs is a run of consecutive lines of a
// test file the suite compiles, indentation aside.
func TestDocs_GoBlocksAreCompiledTestCode(t *testing.T) {
	t.Parallel()
	var homes []string
	for _, h := range goBlockHomes {
		b, err := os.ReadFile(filepath.Join("..", "..", h))
		if err != nil {
			t.Fatal(err)
		}
		homes = append(homes, string(b))
	}
	n := 0
	for _, page := range docPages(t) {
		for _, block := range fencedBlocks(t, page, "go") {
			n++
			if !inAny(block, homes) {
				t.Errorf("%s: this Go block is not the lines of any of %v, which the suite compiles:\n%s",
					page, goBlockHomes, strings.Join(block, "\n"))
			}
		}
	}
	if n == 0 {
		t.Fatal("no Go block found")
	}
}

// inAny reports whether block's lines, each trimmed of its indentation,
// follow one another in one of the files.
func inAny(block []string, files []string) bool {
	for _, f := range files {
		lines := strings.Split(f, "\n")
		for i := range lines {
			if i+len(block) > len(lines) {
				break
			}
			match := true
			for j, l := range block {
				if strings.TrimSpace(lines[i+j]) != strings.TrimSpace(l) {
					match = false
					break
				}
			}
			if match {
				return true
			}
		}
	}
	return false
}

// Every shell block of the README and docs is valid bash, and every capstan
// command in it is one capstan has, with flags its command takes.
func TestDocs_ShellBlocksNameCommandsAndFlagsThatExist(t *testing.T) {
	t.Parallel()
	flagsOf := map[string]map[string]bool{}
	commands := 0
	for _, page := range docPages(t) {
		for _, block := range fencedBlocks(t, page, "sh") {
			text := strings.Join(block, "\n") + "\n"
			check := exec.Command("bash", "-n")
			check.Stdin = strings.NewReader(text)
			if out, err := check.CombinedOutput(); err != nil {
				t.Errorf("%s: a shell block bash does not parse (%v): %s\n%s", page, err, out, text)
			}
			for _, words := range capstanCommands(text) {
				commands++
				name, flags := commandFlags(t, flagsOf, words)
				if flags == nil {
					t.Errorf("%s: capstan %s: no such command", page, strings.Join(words, " "))
					continue
				}
				for _, w := range words {
					f, ok := flagName(w)
					if ok && !flags[f] {
						t.Errorf("%s: capstan %s: %s takes no flag -%s", page, strings.Join(words, " "), name, f)
					}
				}
			}
		}
	}
	if commands < 20 {
		t.Fatalf("only %d capstan commands found in the docs' shell blocks", commands)
	}
}

// capstanCommands returns the words of each capstan command of a shell text
// (also as `go run ./cmd/capstan`), split where the shell splits commands.
func capstanCommands(text string) [][]string {
	text = strings.ReplaceAll(text, "\\\n", " ")
	var out [][]string
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, " #"); i >= 0 {
			line = line[:i]
		}
		for _, seg := range regexp.MustCompile(`&&|\|\||[|;&]|\$\(|\)`).Split(line, -1) {
			words := shellSplit(seg)
			switch {
			case len(words) > 0 && words[0] == "capstan":
				out = append(out, words[1:])
			case len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/capstan":
				out = append(out, words[3:])
			}
		}
	}
	return out
}

// shellSplit splits a simple command into words, keeping quoted text whole.
func shellSplit(s string) []string {
	var words []string
	var cur strings.Builder
	var quote byte
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(c)
		case c == '\'' || c == '"':
			quote, inWord = c, true
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, cur.String()), false
				cur.Reset()
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// flagName is the name of a flag word (--input=x, -o), ok false for others.
func flagName(w string) (string, bool) {
	if !strings.HasPrefix(w, "-") || w == "-" || w == "--" {
		return "", false
	}
	name := strings.TrimLeft(w, "-")
	name, _, _ = strings.Cut(name, "=")
	return name, name != ""
}

// commandFlags returns the command words name (a command and, for those that
// have them, its subcommand) and the flags it takes, from its --help; nil
// when capstan has no such command.
func commandFlags(t *testing.T, cache map[string]map[string]bool, words []string) (string, map[string]bool) {
	t.Helper()
	if len(words) == 0 {
		return "", nil
	}
	if words[0] == "--version" || words[0] == "version" || words[0] == "help" {
		return words[0], map[string]bool{}
	}
	tries := [][]string{words[:1]}
	if len(words) > 1 && !strings.HasPrefix(words[1], "-") {
		tries = [][]string{words[:2], words[:1]}
	}
	for _, cmd := range tries {
		name := strings.Join(cmd, " ")
		if flags, ok := cache[name]; ok {
			return name, flags
		}
		out, err := exec.Command(bin, append(append([]string{}, cmd...), "--help")...).CombinedOutput()
		flags := map[string]bool{"help": true, "h": true}
		for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`).FindAllSubmatch(out, -1) {
			flags[string(m[1])] = true
		}
		if err != nil || len(flags) == 2 || bytes.Contains(out, []byte("unknown command")) {
			continue
		}
		cache[name] = flags
		return name, flags
	}
	return strings.Join(words[:1], " "), nil
}
