package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// capstan server --pprof serves the Go profiles on loopback, and refuses an
// address beyond it: a heap profile shows the process's memory.
func TestServerPprof_ServesProfilesOnLoopbackOnly(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, serverReady, nil, "server", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--pprof", "127.0.0.1:0")
	m := regexp.MustCompile(`profiles on (http://\S+/debug/pprof/)`).FindStringSubmatch(d.out.String())
	if m == nil {
		t.Fatalf("no profiles address printed:\n%s", d.out.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m[1]+"heap?debug=1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "# HeapInuse = ") {
		t.Fatalf("heap profile: %s\n%.300s", resp.Status, body)
	}

	for _, addr := range []string{"0.0.0.0:0", "192.0.2.1:6060", "nonsense"} {
		_, stderr, code := capstan(t, "", "server", "--store", t.TempDir(), "--listen", "127.0.0.1:0", "--pprof", addr)
		if code != exitUsage || !strings.Contains(stderr, "--pprof") {
			t.Errorf("--pprof %s: exit %d, stderr %q; want %d naming --pprof", addr, code, stderr, exitUsage)
		}
	}
}
