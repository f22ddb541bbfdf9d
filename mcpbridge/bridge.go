package mcpbridge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/executor"
	"github.com/capstan-dev/capstan/internal/broker"
)

// Config configures a Bridge. Zero values are the defaults.
type Config struct {
	// Name and Version identify the server to MCP clients. Default "capstan".
	Name, Version string
	// Scope narrows the tools to part of the catalog. Default: all of it.
	Scope executor.Scope
	// CallTimeout bounds how long one tools/call waits for its envelope.
	// Default 5 min. An execution still running then goes on; the result
	// tells the model its execution id, which capstan.status reads later.
	CallTimeout time.Duration
	// ApprovalWait is how long a tools/call that needs an approval keeps the
	// caller waiting for someone else to decide it, with progress
	// notifications, before answering approval-required. Default 0: answer
	// at once.
	ApprovalWait time.Duration
	// TaskAfter is how long a tools/call from a client that declares the
	// Tasks extension waits for its envelope before it answers a task
	// instead: a quick call answers its result, a long one (or one that
	// needs an approval) a task. Default 1 s; negative: a task at once.
	TaskAfter time.Duration
	// ProgressFromRecords makes progress notifications poll each execution's
	// record instead of following its audit trail: for a bridge whose NATS
	// principal may not read the audit stream. A bridge connected as a
	// principal always does; a refused follow falls back to it anyway.
	ProgressFromRecords bool
	// Refresh is how often every actor's tool list is described again even
	// when no catalog change was seen (policies may change what an actor
	// sees). Default 1 min; 10 s for a bridge connected as a principal,
	// which cannot watch the catalog and sees its changes only so.
	Refresh time.Duration
	// ToolNames says how capabilities are named as tools: ToolNamesPortable (the
	// default), which every host takes, or ToolNamesCapabilityIDs.
	ToolNames ToolNames
	// Deployment says how capstan's resources are named (default: capstan's).
	Deployment executor.Deployment
	// Logger receives the bridge's logs. Default: discarded.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.Name == "" {
		c.Name = "capstan"
	}
	if c.ToolNames == "" {
		c.ToolNames = ToolNamesPortable
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = 5 * time.Minute
	}
	if c.TaskAfter == 0 {
		c.TaskAfter = time.Second
	}
	if c.Refresh <= 0 {
		c.Refresh = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Bridge serves the capabilities of a capstan deployment as MCP tools. Each
// actor gets its own MCP server, whose tools are what Describe shows that
// actor on the mcp surface; every tools/call is one execution submitted for
// that actor.
type Bridge struct {
	c   *executor.Client
	nc  *nats.Conn
	cfg Config
	log *slog.Logger

	ctx  context.Context
	stop context.CancelFunc

	mu      sync.Mutex
	views   map[string]*view // by actor kind:id
	pending pendingApprovals
	done    chan struct{}
	// live is the last progress of the executions that reported lately,
	// for the tasks' status messages.
	live liveProgress
}

// New opens the bridge's executor client on nc, on the mcp surface (the
// surface of a call is fixed by the bridge, never by the caller), and follows
// the catalog until Close. nc is the bridge's one identity towards capstan:
// every call is submitted on it, asserting the caller's actor.
func New(nc *nats.Conn, cfg Config) (*Bridge, error) {
	refreshSet := cfg.Refresh > 0
	cfg.defaults()
	c, err := executor.NewClient(nc, executor.ClientConfig{Surface: executor.SurfaceMCP, Deployment: cfg.Deployment, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	b := &Bridge{c: c, nc: nc, cfg: cfg, log: cfg.Logger, views: map[string]*view{},
		done: make(chan struct{})}
	b.pending.init()
	b.ctx, b.stop = context.WithCancel(context.Background())
	if c.Principal() != broker.Anonymous {
		// A principal (the bridge's is a delegating producer) may create no
		// consumer, so it cannot watch the catalog: tools are described
		// again every Refresh instead, and the progress of an execution is
		// read from its record (a producer reads no audit trail).
		b.cfg.ProgressFromRecords = true
		if !refreshSet {
			b.cfg.Refresh = principalRefresh
		}
		go b.follow(nil)
		return b, nil
	}
	changes, err := c.CatalogChanges(b.ctx)
	if err != nil {
		b.stop()
		_ = c.Close()
		return nil, fmt.Errorf("capstan: watch the catalog: %w", err)
	}
	go b.follow(changes)
	return b, nil
}

// principalRefresh is the default Refresh of a bridge connected as a
// principal, which cannot watch the catalog.
const principalRefresh = 10 * time.Second

// BeginClose marks the bridge as closing: from then on a call whose request
// ends, as the server closing the connections ends it, stops waiting and
// leaves its execution running (its result stays readable), even over
// stateless HTTP, where the end of a request otherwise cancels its call.
// It also stops following the catalog. Call it before closing the HTTP
// server's connections, then Close.
func (b *Bridge) BeginClose() { b.stop() }

// Close stops following the catalog and closes the bridge's client (not nc).
// Close the MCP sessions first: their calls need the client.
func (b *Bridge) Close() error {
	b.stop()
	<-b.done
	return b.c.Close()
}

// follow describes every actor's tools again after each catalog change (a
// worker starting or stopping to serve a capability) and every Refresh.
func (b *Bridge) follow(updates <-chan struct{}) {
	defer close(b.done)
	tick := time.NewTicker(b.cfg.Refresh)
	defer tick.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case _, ok := <-updates:
			if !ok {
				updates = nil // the watcher ended; the ticker still refreshes
				continue
			}
			// A worker writes several entries at once: let them land.
			b.settle(updates)
		case <-tick.C:
		}
		b.refreshAll()
	}
}

// settle drains the updates that arrive within a short quiet period.
func (b *Bridge) settle(updates <-chan struct{}) {
	quiet := time.NewTimer(50 * time.Millisecond)
	defer quiet.Stop()
	for {
		select {
		case _, ok := <-updates:
			if !ok {
				return
			}
			quiet.Reset(50 * time.Millisecond)
		case <-quiet.C:
			return
		case <-b.ctx.Done():
			return
		}
	}
}

func (b *Bridge) refreshAll() {
	b.mu.Lock()
	views := make([]*view, 0, len(b.views))
	for _, v := range b.views {
		views = append(views, v)
	}
	b.mu.Unlock()
	for _, v := range views {
		if err := v.refresh(b.ctx); err != nil && b.ctx.Err() == nil {
			b.log.Warn("describe for MCP failed; keeping the last tool list", "actor", v.actor.String(), "err", err)
		}
	}
}

// Server returns the MCP server of one actor: its tools are what that actor
// may see on the mcp surface, and its calls run as that actor. The first
// call describes the catalog for the actor; later calls return the same
// server.
func (b *Bridge) Server(ctx context.Context, actor envelope.Actor) (*mcp.Server, error) {
	if err := checkActor(actor); err != nil {
		return nil, err
	}
	key := actor.String()
	b.mu.Lock()
	v, ok := b.views[key]
	if !ok {
		v = newView(b, actor)
		b.views[key] = v
	}
	b.mu.Unlock()
	if err := v.ready(ctx); err != nil {
		return nil, err
	}
	return v.server, nil
}

// checkActor refuses an actor that could never be asserted.
func checkActor(a envelope.Actor) error {
	if a.Kind == "" || a.ID == "" {
		return fmt.Errorf("capstan: the MCP actor must be kind:id, got %q", a.String())
	}
	return nil
}
