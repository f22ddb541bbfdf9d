package console_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"strings"

	"github.com/capstan-dev/capstan/console"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/natsserver"
	"github.com/nats-io/nats.go"
)

// A console in open mode on loopback: sign in by naming yourself, then read
// the approvals inbox.
func Example() {
	dir, _ := os.MkdirTemp("", "capstan-example-")
	defer os.RemoveAll(dir)
	srv, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
	if err != nil {
		panic(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(natsserver.ClientURL(srv))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	// Servers and workers create capstan's resources; the console only reads.
	if _, err := broker.Provision(context.Background(), nc, broker.Config{}); err != nil {
		panic(err)
	}

	c, err := console.New(console.Config{Open: true, Conn: nc})
	if err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Serve(ctx, l) }()
	base := "http://" + l.Addr().String()

	jar, _ := cookiejar.New(nil)
	web := &http.Client{Jar: jar}
	resp, err := web.Get(base + "/approvals")
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.Request.URL.Path) // sent to sign in first

	resp, err = web.PostForm(base+"/signin", url.Values{"name": {"user:bob"}, "next": {"/approvals"}})
	if err != nil {
		panic(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.Request.URL.Path, strings.Contains(string(page), "Nothing waits for your decision."))

	stop()
	fmt.Println(<-done)
	// Output:
	// /signin
	// /approvals true
	// <nil>
}
