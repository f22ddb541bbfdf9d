package main

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// runAsynq runs the workload on asynq with one server of the same
// concurrency, on an emptied Redis database.
func runAsynq(ctx context.Context, wl workload, addr string, pid int) (*result, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis at %s: %w", addr, err)
	}
	opt := asynq.RedisClientOpt{Addr: addr}
	t := newTracker(wl.n)
	srv := asynq.NewServer(opt, asynq.Config{Concurrency: wl.concurrency, LogLevel: asynq.ErrorLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(ctx context.Context, task *asynq.Task) error {
		if id, ok := asynq.GetTaskID(ctx); ok {
			t.finish(id)
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()

	cpu, err := t.measure(ctx, wl, uuid.NewString, func(ctx context.Context, id string) error {
		_, err := client.EnqueueContext(ctx, asynq.NewTask("noop", wl.payload), asynq.TaskID(id))
		return err
	}, pid)
	if err != nil {
		return nil, err
	}
	return t.result("asynq v0.26.0", "Redis "+redisVersion(ctx, rdb)+", append-only file", cpu), nil
}

func redisVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.InfoMap(ctx, "server").Result()
	if err != nil {
		return ""
	}
	return info["Server"]["redis_version"]
}
