#!/usr/bin/env bash
# What capstan adds to a program's binary: examples/hello (a worker and a
# client, one call), and a client alone (a program that only calls) against programs that use nats.go alone for a round trip
# (core NATS: connect, subscribe, publish a request, read the reply; and
# JetStream: a stream, a consumer, one message published and consumed). All
# are built with this module's versions, with and without -ldflags="-s -w".
set -euo pipefail
cd "$(dirname "$0")/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/core" "$tmp/jetstream" "$tmp/client"

cat >"$tmp/core/main.go" <<'EOF'
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	nc, err := nats.Connect(os.Getenv("CAPSTAN_NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	if _, err := nc.Subscribe("greet.hello", func(m *nats.Msg) { _ = m.Respond([]byte("Hello, " + string(m.Data) + "!")) }); err != nil {
		panic(err)
	}
	reply, err := nc.Request("greet.hello", []byte("Ada"), 5*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(reply.Data))
}
EOF

cat >"$tmp/jetstream/main.go" <<'EOF'
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(os.Getenv("CAPSTAN_NATS_URL"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "HELLO", Subjects: []string{"greet.>"}})
	if err != nil {
		panic(err)
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "greeters", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		panic(err)
	}
	if _, err := js.Publish(ctx, "greet.hello", []byte("Ada")); err != nil {
		panic(err)
	}
	m, err := c.Next()
	if err != nil {
		panic(err)
	}
	_ = m.Ack()
	fmt.Println("Hello, " + string(m.Data()) + "!")
}
EOF

cat >"$tmp/client/main.go" <<'EOF'
package main

import (
	"context"
	"fmt"

	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
)

func main() {
	nc, err := broker.Connect(broker.ConnectOptions{Name: "client"})
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceDirect})
	if err != nil {
		panic(err)
	}
	ada := envelope.Actor{Kind: envelope.ActorUser, ID: "ada"}
	env, err := c.Call(context.Background(), "greet.hello", map[string]string{"name": "Ada"}, executor.As(ada))
	if err != nil {
		panic(err)
	}
	fmt.Println(env.Status)
}
EOF

size() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }
mb() { awk -v b="$1" 'BEGIN { printf "%.2f MB", b / 1e6 }'; }

go version
printf '%-34s %12s %12s\n' program default '-s -w'
declare -A sizes
for prog in hello client core jetstream; do
	src="./examples/hello"
	if [[ $prog != hello ]]; then
		src="$tmp/$prog/main.go" # built as files, against this module's go.mod
	fi
	go build -o "$tmp/$prog.bin" "$src"
	go build -ldflags="-s -w" -o "$tmp/$prog.sw.bin" "$src"
	sizes[$prog]=$(size "$tmp/$prog.bin")
	sizes[$prog.sw]=$(size "$tmp/$prog.sw.bin")
done
printf '%-34s %12s %12s\n' "examples/hello (capstan)" "$(mb "${sizes[hello]}")" "$(mb "${sizes[hello.sw]}")"
printf '%-34s %12s %12s\n' "a client alone (capstan)" "$(mb "${sizes[client]}")" "$(mb "${sizes[client.sw]}")"
printf '%-34s %12s %12s\n' "nats.go, core round trip" "$(mb "${sizes[core]}")" "$(mb "${sizes[core.sw]}")"
printf '%-34s %12s %12s\n' "nats.go, JetStream round trip" "$(mb "${sizes[jetstream]}")" "$(mb "${sizes[jetstream.sw]}")"
printf '%-34s %12s %12s\n' "capstan over core" "$(mb $((sizes[hello] - sizes[core])))" "$(mb $((sizes[hello.sw] - sizes[core.sw])))"
printf '%-34s %12s %12s\n' "capstan over JetStream" "$(mb $((sizes[hello] - sizes[jetstream])))" "$(mb $((sizes[hello.sw] - sizes[jetstream.sw])))"
printf '%-34s %12s %12s\n' "a client over JetStream" "$(mb $((sizes[client] - sizes[jetstream])))" "$(mb $((sizes[client.sw] - sizes[jetstream.sw])))"
