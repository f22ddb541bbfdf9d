// Command subjects measures what JetStream's in-memory index costs per
// message for the subject layouts capstan's retention design weighs, on an
// embedded server in this process: N messages of about 300 bytes
//
//   - per-id: each on its own subject (`a.<uuid>`), as today's audit events,
//     records and envelopes;
//   - sharded: on one of 1,024 subjects chosen by a hash of the id, as the
//     proposed audit layout;
//   - per-id with a TTL: each on its own subject with a per-message TTL
//     (`Nats-TTL`), measured after the TTL passed, as the proposed records.
//
// For each it prints the live heap (after a GC) per message, right after the
// writes and again once the block caches expired, with the stream's subject
// count.
//
// With -audit it measures capstan's audit trail itself instead, per
// execution of three events (capability.requested, .started, .completed), on
// a provisioned audit stream:
//
//   - audit-per-id: each event a message on capstan.audit.<executionId>, as
//     versions before the shards stored them;
//   - audit-sharded: each event a message on the execution's shard
//     (auditemit.Emitter.Emit), as workers emit today;
//   - audit-one-message: the three in one message on the shard
//     (auditemit.Emitter.EmitAll);
//
// and the time audit.Read takes for one trail among them all.
//
//	go run ./subjects -n 200000
//	go run ./subjects -audit -n 200000
//	go run ./subjects -audit -n 100000 -rate 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	n := flag.Int("n", 200000, "messages (with -audit, executions) per layout")
	withAudit := flag.Bool("audit", false, "measure capstan's audit layouts: per execution, per shard, one message per execution")
	rate := flag.Int("rate", 0, "with -audit: executions/s (0: as fast as the server stores them)")
	only := flag.String("layouts", "", "with -audit: the layouts to measure, comma-separated (default all)")
	flag.Parse()
	if *withAudit {
		for _, layout := range []string{"audit-per-id", "audit-sharded", "audit-one-message"} {
			if *only != "" && !strings.Contains(","+*only+",", ","+layout+",") {
				continue
			}
			if err := measureAudit(layout, *n, *rate); err != nil {
				fmt.Fprintln(os.Stderr, "subjects:", err)
				os.Exit(1)
			}
		}
		return
	}
	for _, layout := range []string{"per-id", "sharded", "per-id-ttl"} {
		if err := measure(layout, *n); err != nil {
			fmt.Fprintln(os.Stderr, "subjects:", err)
			os.Exit(1)
		}
	}
}

func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func measure(layout string, n int) error {
	nc, stop, err := startServer()
	if err != nil {
		return err
	}
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ttl := 3 * time.Second
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"a.>"},
		Storage: jetstream.FileStorage, AllowMsgTTL: layout == "per-id-ttl"})
	if err != nil {
		return err
	}
	before := liveHeap()
	body := []byte(strings.Repeat("x", 300))
	var opts []jetstream.PublishOpt
	if layout == "per-id-ttl" {
		opts = append(opts, jetstream.WithMsgTTL(ttl))
	}
	var last jetstream.PubAckFuture
	for i := 0; i < n; i++ {
		id := uuid.Must(uuid.NewV7()).String()
		subject := "a._anon." + id
		if layout == "sharded" {
			h := fnv.New32a()
			h.Write([]byte(id))
			subject = fmt.Sprintf("a.%03x", h.Sum32()%1024)
		}
		if last, err = js.PublishAsync(subject, body, opts...); err != nil {
			return err
		}
		if i%1024 == 1023 {
			<-js.PublishAsyncComplete()
		}
	}
	<-js.PublishAsyncComplete()
	select {
	case <-last.Ok():
	case err := <-last.Err():
		return err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	written := liveHeap()
	fmt.Printf("%-11s %d messages, %7d subjects: live heap %6.0f bytes per message after the writes", layout, n, info.State.NumSubjects, float64(written-before)/float64(n))
	// The block caches expire after 10 s; a per-message TTL after ttl.
	time.Sleep(12 * time.Second)
	info, err = stream.Info(ctx)
	if err != nil {
		return err
	}
	fmt.Printf(", %6.0f once caches expired (%d messages, %d subjects left)\n", (float64(liveHeap())-float64(before))/float64(n), info.State.Msgs, info.State.NumSubjects)
	return nil
}

// startServer starts a JetStream server on loopback in a temporary
// directory and connects to it; stop closes the connection, stops the
// server and removes the directory.
func startServer() (nc *nats.Conn, stop func(), err error) {
	dir, err := os.MkdirTemp("", "capstan-subjects-")
	if err != nil {
		return nil, nil, err
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoSigs: true})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	s.Start()
	shutdown := func() { s.Shutdown(); s.WaitForShutdown(); os.RemoveAll(dir) }
	if !s.ReadyForConnections(10 * time.Second) {
		shutdown()
		return nil, nil, fmt.Errorf("server not ready")
	}
	if nc, err = nats.Connect(s.ClientURL()); err != nil {
		shutdown()
		return nil, nil, err
	}
	return nc, func() { nc.Close(); shutdown() }, nil
}
