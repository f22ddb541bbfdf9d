package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestREADME_OfficialServerSetupFromZero runs the official-server setup block
// of docs/security.md (where the README sends its reader) as it is written,
// in an empty directory: every line, with the
// official nats-server built from the module capstan depends on. Only the
// port (4222) and the store (/var/lib/capstan) are replaced, by a free port
// and a temporary directory; lines ending in & run in the background until
// the test ends. Every other command must succeed, the last one printing a
// completed execution (for a person: its Status line).
func TestREADME_OfficialServerSetupFromZero(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds nats-server")
	}
	lines := readmeBlock(t, "<!-- official-server setup -->")
	natsServer := buildNatsServer(t)
	dir, store := t.TempDir(), t.TempDir()
	port := freePort(t)
	env := []string{fmt.Sprintf("CAPSTAN_NATS_URL=nats://127.0.0.1:%d", port)}
	var last string
	for _, line := range lines {
		line = strings.ReplaceAll(line, "4222", fmt.Sprint(port))
		line = strings.ReplaceAll(line, "/var/lib/capstan", store)
		words, background := shellWords(t, line)
		if len(words) == 0 {
			continue
		}
		var prog string
		switch words[0] {
		case "capstan":
			prog = bin
		case "nats-server":
			prog = natsServer
		default:
			t.Fatalf("the block runs %q, which this test does not know", words[0])
		}
		if background {
			d := &daemon{cmd: exec.Command(prog, words[1:]...), exited: make(chan struct{})}
			d.cmd.Dir, d.cmd.Env = dir, append(os.Environ(), env...)
			d.cmd.Stdout, d.cmd.Stderr = &d.out, &d.out
			if err := d.cmd.Start(); err != nil {
				t.Fatal(err)
			}
			go func() { d.err = d.cmd.Wait(); close(d.exited) }()
			t.Cleanup(func() { d.cleanup(t) })
			if words[0] == "nats-server" {
				waitListening(t, d, port)
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		cmd := exec.CommandContext(ctx, prog, words[1:]...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		checkRaces(t, line, stderr.String())
		if err != nil {
			t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", line, err, stdout.String(), stderr.String())
		}
		last = stdout.String()
	}
	if !regexp.MustCompile(`(?m)^Status\s+completed$`).MatchString(last) {
		t.Fatalf("the block's last command printed:\n%s", last)
	}
}

// readmeBlock returns the lines of the fenced block that follows marker in
// docs/security.md.
func readmeBlock(t *testing.T, marker string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	state := 0 // 0: before the marker, 1: before the fence, 2: in the block
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case state == 0 && strings.TrimSpace(l) == marker:
			state = 1
		case state == 1 && strings.HasPrefix(l, "```"):
			state = 2
		case state == 2 && strings.HasPrefix(l, "```"):
			return lines
		case state == 2:
			lines = append(lines, l)
		}
	}
	t.Fatalf("docs/security.md has no fenced block after %q", marker)
	return nil
}

// shellWords splits a line as a POSIX shell would for the documentation's simple
// commands: words, single-quoted strings, a # comment, a trailing &.
func shellWords(t *testing.T, line string) (words []string, background bool) {
	t.Helper()
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quoted && c == '\'':
			quoted = false
		case quoted:
			cur.WriteByte(c)
		case c == '\'':
			quoted, inWord = true, true
		case c == '#' && !inWord:
			i = len(line)
		case c == ' ' || c == '\t':
			if inWord {
				words, inWord = append(words, cur.String()), false
				cur.Reset()
			}
		case strings.ContainsRune(`"$\|;<>`+"`", rune(c)):
			t.Fatalf("the line %q needs a shell (%q): this test runs simple commands only", line, c)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quoted {
		t.Fatalf("unbalanced quote in %q", line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	if n := len(words); n > 0 && words[n-1] == "&" {
		return words[:n-1], true
	}
	return words, false
}

// buildNatsServer builds the official nats-server from the module capstan
// depends on.
func buildNatsServer(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nats-server")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}
	return path
}

// waitListening waits until the process listens on port.
func waitListening(t *testing.T, d *daemon, port int) {
	t.Helper()
	deadline := time.After(guard)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-d.exited:
			t.Fatalf("%s exited (%v):\n%s", d.cmd.Path, d.err, d.out.String())
		case <-deadline:
			t.Fatalf("%s never listened on %d:\n%s", d.cmd.Path, port, d.out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
