package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

type noopArgs struct {
	ID   string `json:"id"`
	Data string `json:"data"`
}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// runRiver runs the workload on River with one client of the same
// concurrency, on a freshly migrated schema. River fetches at most
// MaxWorkers jobs per fetch and waits FetchCooldown (default 100 ms) between
// fetches, which caps it near concurrency / cooldown; cooldown 0 keeps the
// default.
func runRiver(ctx context.Context, wl workload, url string, pid int, cooldown time.Duration) (*result, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS public CASCADE; CREATE SCHEMA public"); err != nil {
		return nil, fmt.Errorf("postgres at %s: %w", url, err)
	}
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return nil, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, fmt.Errorf("river migrate: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &noopWorker{})
	client, err := river.NewClient(driver, &river.Config{
		Queues:        map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: wl.concurrency}},
		Workers:       workers,
		Logger:        quietLogger(),
		FetchCooldown: cooldown,
	})
	if err != nil {
		return nil, err
	}
	t := newTracker(wl.n)
	events, cancelEvents := client.SubscribeConfig(&river.SubscribeConfig{ChanSize: wl.n + 1000, Kinds: []river.EventKind{river.EventKindJobCompleted}})
	defer cancelEvents()
	go func() {
		for ev := range events {
			var a noopArgs
			if ev.Job != nil && json.Unmarshal(ev.Job.EncodedArgs, &a) == nil {
				t.finish(a.ID)
			}
		}
	}()
	if err := client.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()

	cpu, err := t.measure(ctx, wl, uuid.NewString, func(ctx context.Context, id string) error {
		_, err := client.Insert(ctx, noopArgs{ID: id, Data: string(wl.payload)}, nil)
		return err
	}, pid)
	if err != nil {
		return nil, err
	}
	var version string
	_ = pool.QueryRow(ctx, "SHOW server_version").Scan(&version)
	name := "River v0.51.2"
	if cooldown > 0 {
		name += fmt.Sprintf(", FetchCooldown %v", cooldown)
	}
	return t.result(name, "PostgreSQL "+version+", synchronous_commit off", cpu), nil
}
