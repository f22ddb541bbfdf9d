package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/capstan-dev/capstan/auth"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/credfile"
	"github.com/capstan-dev/capstan/internal/trail"
)

// runAuth dispatches the credential commands.
func runAuth(args []string) int {
	usage := "usage: capstan auth init|add|set|remove|list|push|migrate DIR ...\n\n" +
		"  init DIR [--prefix P] [--resolver-dir D]  operator, accounts, admin and worker principals, DIR/nats-server.conf\n" +
		"  add DIR NAME --role R ...                 a principal and DIR/NAME.creds (producer: --actor; approver: --types)\n" +
		"  set DIR NAME [--max-*] [--quota-*]        change a producer's or approver's limits and quotas (then push)\n" +
		"  remove DIR NAME                           revoke a principal (then push: it is disconnected at once)\n" +
		"  list DIR                                  every principal, its grants, limits and quotas\n" +
		"  push DIR                                  bring a running server or cluster to the setup: accounts, resources, grants\n" +
		"  migrate DIR                               move a one-account setup to accounts per principal (new credentials!)\n"
	return runGroup("auth", usage, args, map[string]func([]string) int{
		"init":    runAuthInit,
		"add":     runAuthAdd,
		"set":     runAuthSet,
		"remove":  runAuthRemove,
		"list":    runAuthList,
		"push":    runAuthPush,
		"migrate": runAuthMigrate,
	})
}

// parseSetup parses args as parseFlags does and loads the setup directory
// the first of them names.
func parseSetup(fs *flag.FlagSet, args []string, want int) (*auth.Setup, []string, int, bool) {
	pos, code, ok := parseFlags(fs, args, want)
	if !ok {
		return nil, nil, code, false
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return nil, nil, fail(exitUsage, "%s: %v", fs.Name(), err), false
	}
	return s, pos, exitOK, true
}

func runAuthInit(args []string) int {
	fs := newFlags("auth init", "DIR [--prefix P] [--resolver-dir D]")
	prefix := fs.String("prefix", "", "prefix of capstan's resource names (default CAPSTAN)")
	resolverDir := fs.String("resolver-dir", "", "`directory` where an official nats-server keeps the accounts pushed to it (default DIR/"+credfile.ResolverDirName+"; each server needs its own)")
	logName := fs.String("log-name", "", "the audit log's name, on every checkpoint and its signing key: unique, such as audit.example.com/payments (default capstan/<prefix>/<random>)")
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	if *logName != "" {
		if err := trail.ValidOrigin(*logName); err != nil {
			return usageError("--log-name: %v", err)
		}
	} else {
		*logName = trail.DefaultOrigin(*prefix)
	}
	s, err := auth.Init(pos[0], *prefix)
	if err != nil {
		return fail(exitFailed, "auth init: %v", err)
	}
	// The audit log's signing key, which the server signs checkpoints with;
	// its public key is what auditors verify with.
	if _, err := trail.Keygen(pos[0], *logName); err != nil {
		return fail(exitFailed, "auth init: audit signing key: %v", err)
	}
	if *resolverDir != "" {
		if err := s.SetResolverDir(*resolverDir); err != nil {
			return fail(exitFailed, "auth init: %v", err)
		}
	}
	fmt.Printf("created %s: %s, %s, %s, %s, %s (public: %s)\n", pos[0], credfile.ServerConfigFile,
		s.CredsPath(auth.AdminPrincipal), s.CredsPath(auth.WorkerPrincipal), s.PushCredsPath(),
		filepath.Join(pos[0], trail.KeyFile), trail.PublicKeyFile)
	fmt.Printf("next:\n  capstan auth add %s NAME --role producer --actor user:NAME --capabilities 'demo.*'\n  capstan server --auth %s\n", pos[0], pos[0])
	return exitOK
}

// limitFlags are a principal's account limits.
type limitFlags struct {
	connections, subscriptions int64
	payload                    byteSize
}

func addLimitFlags(fs *flag.FlagSet) *limitFlags {
	l := &limitFlags{payload: byteSize(auth.DefaultLimits.Payload)}
	fs.Int64Var(&l.connections, "max-connections", auth.DefaultLimits.Connections, "connections the principal may hold at once (-1: no limit)")
	fs.Int64Var(&l.subscriptions, "max-subscriptions", auth.DefaultLimits.Subscriptions, "subscriptions the principal may hold at once, all its connections together (-1: no limit)")
	fs.Var(&l.payload, "max-payload", "largest `size` of a message the principal may publish, such as 256KiB or 1MiB (-1: the server's)")
	return l
}

func (l *limitFlags) limits() *auth.Limits {
	return &auth.Limits{Connections: l.connections, Subscriptions: l.subscriptions, Payload: int64(l.payload)}
}

// quotaFlags are a principal's quotas (DESIGN §12 "Quotas").
type quotaFlags struct {
	queued, pendingApprovals, controlRate int64
	queuedBytes                           byteSize
}

func addQuotaFlags(fs *flag.FlagSet) *quotaFlags {
	d := auth.DefaultQuotas
	q := &quotaFlags{queuedBytes: byteSize(d.QueuedBytes)}
	fs.Int64Var(&q.queued, "quota-queued", d.QueuedRequests, "requests the principal may have waiting in the queue at once (-1: no quota)")
	fs.Var(&q.queuedBytes, "quota-queued-bytes", "`size` its waiting requests may hold at once, such as 64MiB (-1: no quota)")
	fs.Int64Var(&q.pendingApprovals, "quota-pending-approvals", d.PendingApprovals, "approvals the principal may have pending at once (-1: no quota)")
	fs.Int64Var(&q.controlRate, "quota-control-rate", d.ControlPerSecond, "control requests (listings, describes, cancels, probes) per second (-1: no quota)")
	return q
}

func (q *quotaFlags) quotas() *auth.Quotas {
	return &auth.Quotas{QueuedRequests: q.queued, QueuedBytes: int64(q.queuedBytes),
		PendingApprovals: q.pendingApprovals, ControlPerSecond: q.controlRate}
}

// flagsSet reports whether a flag whose name starts with prefix was given.
func flagsSet(fs *flag.FlagSet, prefix string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || strings.HasPrefix(f.Name, prefix) })
	return set
}

// byteSize is a flag of bytes: 262144, 256KiB, 1MiB, 1GiB, 1MB, or -1.
type byteSize int64

func (b *byteSize) String() string {
	if b == nil {
		return ""
	}
	v := int64(*b)
	switch {
	case v > 0 && v%(1<<30) == 0:
		return strconv.FormatInt(v>>30, 10) + "GiB"
	case v > 0 && v%(1<<20) == 0:
		return strconv.FormatInt(v>>20, 10) + "MiB"
	case v > 0 && v%(1<<10) == 0:
		return strconv.FormatInt(v>>10, 10) + "KiB"
	}
	return strconv.FormatInt(v, 10)
}

func (b *byteSize) Set(s string) error {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = n, u.mult
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || (v < 1 && !(v == -1 && mult == 1)) {
		return errors.New("want a size such as 262144, 256KiB or 1MiB, or -1")
	}
	*b = byteSize(v * mult)
	return nil
}

func runAuthAdd(args []string) int {
	fs := newFlags("auth add", "DIR NAME --role producer|approver|worker|admin|notifier [--actor KIND:ID] [--surfaces S,S] [--capabilities ID,PREFIX.*|'*'] [--types T,T] [--pool P] [--max-connections N] [--max-subscriptions N] [--max-payload SIZE] [--quota-queued N] [--quota-queued-bytes SIZE] [--quota-pending-approvals N] [--quota-control-rate N]")
	role := fs.String("role", "", "producer, approver, worker, admin or notifier")
	actors := fs.String("actor", "", "actors the principal may act as, comma-separated: kind:id, or kind:* for a gateway that authenticates its users")
	surfaces := fs.String("surfaces", "", "surfaces a producer may call from, comma-separated (default all)")
	caps := fs.String("capabilities", "", "capabilities a producer may call, comma-separated: ids, prefixes like orders.*, or '*' for every one; required for a producer, none granted by default")
	types := fs.String("types", "", "approval types an approver may decide, comma-separated, or *")
	pool := fs.String("pool", "", "pool of a worker")
	lf := addLimitFlags(fs)
	qf := addQuotaFlags(fs)
	s, pos, code, ok := parseSetup(fs, args, 2)
	if !ok {
		return code
	}
	g := auth.Grant{Principal: pos[1], Role: auth.Role(*role), Actors: list(*actors),
		Surfaces: list(*surfaces), Types: list(*types), Pool: *pool}
	if g.Role == auth.RoleProducer {
		g.Capabilities = list(*caps)
	} else if *caps != "" {
		return usageError("auth add: --capabilities is a producer's; a %s calls no capability", g.Role)
	}
	if auth.HasOwnAccount(g.Role) {
		g.Limits, g.Quotas = lf.limits(), qf.quotas()
	} else if flagsSet(fs, "max-") || flagsSet(fs, "quota-") {
		return usageError("auth add: --max-* and --quota-* bound a producer or approver; a %s lives in the capstan account", g.Role)
	}
	if g.Role == auth.RoleProducer && len(g.Capabilities) == 0 {
		if err := g.Validate(); err != nil {
			return fail(exitUsage, "auth add: %v", err) // what else is wrong comes first
		}
		// No capability is granted by default: a forgotten flag must not
		// hand a producer the whole catalog.
		return usageError("auth add: a producer needs --capabilities: the capabilities %s may call (ids, prefixes like orders.*, or '*' for every one); none is granted by default, and nothing was added", pos[1])
	}
	if err := s.Add(g); err != nil {
		return fail(exitUsage, "auth add: %v", err)
	}
	fmt.Printf("created %s\n", s.CredsPath(g.Principal))
	fmt.Printf("a running server learns it with: capstan auth push %s\n", pos[0])
	return exitOK
}

func runAuthSet(args []string) int {
	fs := newFlags("auth set", "DIR NAME [--max-connections N] [--max-subscriptions N] [--max-payload SIZE] [--quota-queued N] [--quota-queued-bytes SIZE] [--quota-pending-approvals N] [--quota-control-rate N]")
	lf := addLimitFlags(fs)
	qf := addQuotaFlags(fs)
	pos, code, ok := parseFlags(fs, args, 2)
	if !ok {
		return code
	}
	if !flagsSet(fs, "max-") && !flagsSet(fs, "quota-") {
		return usageError("auth set: name what to change: --max-* (the account's limits) or --quota-* (its quotas)")
	}
	s, err := auth.Load(pos[0])
	if err != nil {
		return fail(exitUsage, "auth set: %v", err)
	}
	g, found := s.Grant(pos[1])
	if !found {
		return fail(exitUsage, "auth set: no principal %q in %s", pos[1], pos[0])
	}
	// Only what was given changes: the flags left out keep the principal's
	// current values, not the defaults.
	var limits *auth.Limits
	if flagsSet(fs, "max-") {
		l := g.Limits.OrDefault()
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "max-connections":
				l.Connections = lf.connections
			case "max-subscriptions":
				l.Subscriptions = lf.subscriptions
			case "max-payload":
				l.Payload = int64(lf.payload)
			}
		})
		limits = &l
	}
	var quotas *auth.Quotas
	if flagsSet(fs, "quota-") {
		q := g.Quotas.OrDefault()
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "quota-queued":
				q.QueuedRequests = qf.queued
			case "quota-queued-bytes":
				q.QueuedBytes = int64(qf.queuedBytes)
			case "quota-pending-approvals":
				q.PendingApprovals = qf.pendingApprovals
			case "quota-control-rate":
				q.ControlPerSecond = qf.controlRate
			}
		})
		quotas = &q
	}
	if err := s.Set(pos[1], limits, quotas); err != nil {
		return fail(exitUsage, "auth set: %v", err)
	}
	g, _ = s.Grant(pos[1])
	fmt.Printf("%s: limits %s; quotas %s\n", g.Principal, limitsText(g.Limits), quotasText(g.Quotas))
	fmt.Printf("servers and workers apply them once you run: capstan auth push %s\n", pos[0])
	return exitOK
}

func runAuthRemove(args []string) int {
	fs := newFlags("auth remove", "DIR NAME")
	s, pos, code, ok := parseSetup(fs, args, 2)
	if !ok {
		return code
	}
	if err := s.Remove(pos[1]); err != nil {
		return fail(exitUsage, "auth remove: %v", err)
	}
	fmt.Printf("revoked %s in %s\n", pos[1], pos[0])
	fmt.Printf("it is disconnected from every server, and workers refuse what it sent, once you run: capstan auth push %s\n", pos[0])
	return exitOK
}

func runAuthList(args []string) int {
	fs := newFlags("auth list", "DIR")
	s, _, code, ok := parseSetup(fs, args, 1)
	if !ok {
		return code
	}
	if err := s.Current(); err != nil {
		fmt.Fprintf(os.Stderr, "capstan: %v\n", err)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PRINCIPAL\tROLE\tACTORS\tSURFACES\tCAPABILITIES\tTYPES\tACCOUNT\tLIMITS\tQUOTAS\tCREDS")
	for _, g := range s.Principals {
		account, limits, quotas := "capstan", "-", "-"
		if g.Account != "" {
			account = "own"
			limits, quotas = limitsText(g.Limits), quotasText(g.Quotas)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Principal, g.Role, dash(g.Actors), dash(g.Surfaces),
			dash(g.Capabilities), dash(g.Types), account, limits, quotas, s.CredsPath(g.Principal))
	}
	_ = tw.Flush()
	return exitOK
}

// limitsText is an account's limits (the defaults for nil) in one word.
func limitsText(l *auth.Limits) string {
	v := l.OrDefault()
	p := byteSize(v.Payload)
	return fmt.Sprintf("conns=%s,subs=%s,payload=%s", limit(v.Connections), limit(v.Subscriptions), p.String())
}

// quotasText is a principal's quotas (the defaults for nil, which a setup
// made before quotas holds) in one word.
func quotasText(q *auth.Quotas) string {
	v := q.OrDefault()
	b := byteSize(v.QueuedBytes)
	return fmt.Sprintf("queued=%s,queued-bytes=%s,pending-approvals=%s,control=%s/s",
		limit(v.QueuedRequests), b.String(), limit(v.PendingApprovals), limit(v.ControlPerSecond))
}

func limit(v int64) string {
	if v < 0 {
		return "none"
	}
	return strconv.FormatInt(v, 10)
}

func runAuthPush(args []string) int {
	fs := newFlags("auth push", "DIR [--nats URL] [--creds DIR/admin.creds] [--push-creds DIR/push.creds]")
	conn := addConnFlags(fs)
	pushCreds := fs.String("push-creds", "", "credentials `file` of the system account's push user (default DIR/push.creds)")
	s, _, code, ok := parseSetup(fs, args, 1)
	if !ok {
		return code
	}
	if err := s.Current(); err != nil {
		return fail(exitUsage, "auth push: %v", err)
	}
	// Accounts signed by an earlier version get this version's crossings.
	if resigned, err := s.Sync(); err != nil {
		return fail(exitFailed, "auth push: %v", err)
	} else if resigned {
		fmt.Printf("re-signed the accounts whose exports or imports this version changes\n")
	}
	if conn.creds == "" {
		conn.creds = s.CredsPath(auth.AdminPrincipal)
	}
	if *pushCreds == "" {
		*pushCreds = s.PushCredsPath()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ao, err := conn.options("auth push")
	if err != nil {
		return usageError("%v", err)
	}
	ao.Prefix = s.Prefix
	po := ao
	po.Creds = *pushCreds
	res, err := pushSetup(ctx, s, po, ao, broker.Config{Prefix: s.Prefix})
	if err != nil {
		return fail(exitFailed, "auth push: %v", err)
	}
	fmt.Printf("pushed %d accounts to %d servers; resources provisioned; published %d grants\n", res.accounts, res.servers, len(s.Principals))
	return exitOK
}

// pushed is what pushSetup did.
type pushed struct{ accounts, servers int }

// pushSetup brings a running server or cluster to the setup: every account,
// as the push user (po), so that principals added connect and those removed
// are disconnected at once; then, as the admin (ao), capstan's resources
// provisioned (an admin's right: workers may not create or update streams)
// and the grants published.
func pushSetup(ctx context.Context, s *auth.Setup, po, ao broker.ConnectOptions, bcfg broker.Config) (pushed, error) {
	res := pushed{accounts: 1 + len(s.Removed)}
	for _, g := range s.Principals {
		if g.AccountJWT != "" {
			res.accounts++
		}
	}
	var err error
	if res.servers, err = pushAccounts(ctx, po, s); err != nil {
		return res, err
	}
	anc, err := broker.Connect(ao)
	if err != nil {
		return res, err
	}
	defer anc.Close()
	b, err := broker.Provision(ctx, anc, bcfg)
	if err != nil {
		return res, fmt.Errorf("provision as %s: %w", ao.Creds, err)
	}
	return res, auth.PublishGrants(ctx, b.JS, s, b.Replicas)
}

func runAuthMigrate(args []string) int {
	fs := newFlags("auth migrate", "DIR [--max-connections N] [--max-subscriptions N] [--max-payload SIZE]")
	lf := addLimitFlags(fs)
	pos, code, ok := parseFlags(fs, args, 1)
	if !ok {
		return code
	}
	rep, err := auth.Migrate(pos[0], lf.limits())
	if err != nil {
		return fail(exitFailed, "auth migrate: %v (run it again to finish: it resumes where it stopped)", err)
	}
	if rep.Current {
		fmt.Println(rep)
		return exitOK
	}
	fmt.Printf("migrated %s to accounts per principal; what it rewrote, as it was, is in %s\n", pos[0], rep.Backup)
	fmt.Printf("\n!! NEW CREDENTIALS: hand these out again; the old ones stop working once the servers run the new configuration:\n")
	for _, p := range rep.Reissued {
		fmt.Printf("!!   %s\n", (&auth.Setup{Dir: pos[0]}).CredsPath(p))
	}
	fmt.Printf("\nnext:\n  1. restart every server once on %s (a capstan server --auth %s restarts the same way)\n  2. capstan auth push %s\n",
		(&auth.Setup{Dir: pos[0]}).ServerConfigPath(), pos[0], pos[0])
	return exitOK
}

// list splits a comma-separated flag, dropping empty items.
func list(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

func dash(v []string) string {
	if len(v) == 0 {
		return "-"
	}
	return strings.Join(v, ",")
}

// pushAccounts sends the setup's accounts, as the push user (o), to the
// server or cluster o reaches; it returns how many servers took them.
func pushAccounts(ctx context.Context, o broker.ConnectOptions, s *auth.Setup) (int, error) {
	nc, err := broker.Connect(o)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	return auth.PushAccounts(ctx, nc, s)
}

// pushOptions are the push user's connection to an embedded server.
func pushOptions(url string, s *auth.Setup) broker.ConnectOptions {
	return broker.ConnectOptions{URL: url, Creds: s.PushCredsPath(), Prefix: s.Prefix, Name: "capstan push"}
}
