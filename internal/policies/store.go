package policies

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/oplog"
)

// The bucket holds each version under v.<N>, written once, and which one is
// in force under current, changed by compare-and-swap: a version is written
// before it is put in force, so that nothing ever points at a version that is
// not there, and an apply interrupted between the two leaves the old version
// in force.
const currentKey = "current"

func versionKey(n int) string { return "v." + strconv.Itoa(n) }

// ErrChanged: another operator applied or removed a set meanwhile; nothing
// was changed.
var ErrChanged = errors.New("capstan: the policies changed meanwhile")

// Version is one policy set as the bucket keeps it.
type Version struct {
	V int `json:"v"`
	// Version numbers the sets applied, from 1.
	Version int `json:"version"`
	// Text is the set, in the Cedar language; SHA256 its hash.
	Text   string `json:"text"`
	SHA256 string `json:"sha256"`
	// Rules is how many policies it holds, Policies their names.
	Rules    int      `json:"rules"`
	Policies []string `json:"policies"`
	// File is the name of the file it was applied from.
	File string `json:"file,omitempty"`
	// By is the principal that applied it, Operator the person at its
	// keyboard; At when; Reason why.
	By       string    `json:"by"`
	Operator string    `json:"operator,omitempty"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason"`
	// AuditID is the trail's id of its apply.
	AuditID string `json:"auditId"`
}

// Current says which version is in force.
type Current struct {
	V int `json:"v"`
	// Version is the version in force; 0: none (the set was removed).
	Version int `json:"version"`
	// Latest is the newest version ever applied.
	Latest int `json:"latest"`
	// SHA256 is the version's hash, so that a worker can tell it loaded
	// the right text.
	SHA256 string `json:"sha256,omitempty"`
	// By, Operator, At, Reason and AuditID are the last change's.
	By       string    `json:"by"`
	Operator string    `json:"operator,omitempty"`
	At       time.Time `json:"at"`
	Reason   string    `json:"reason"`
	AuditID  string    `json:"auditId"`
}

// Bucket opens the policies bucket; with create, a missing one is created
// (an admin's right). Without create, a missing bucket is
// jetstream.ErrBucketNotFound: no set was ever applied.
func Bucket(ctx context.Context, js jetstream.JetStream, n broker.Names, create bool) (jetstream.KeyValue, error) {
	return broker.OperatorBucket(ctx, js, n.PoliciesBucket(), create)
}

// ReadCurrent returns what is in force (a zero Current when nothing ever
// was) and its revision (0: no current key).
func ReadCurrent(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue) (*Current, uint64, error) {
	c, rev, err := oplog.Read[Current](ctx, nc, kv, currentKey, currentKey+" of the policies bucket")
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &Current{}, 0, nil
	}
	return c, rev, err
}

// ReadVersion returns version n.
func ReadVersion(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue, n int) (*Version, error) {
	what := fmt.Sprintf("policy set v%d", n)
	v, rev, err := oplog.Read[Version](ctx, nc, kv, versionKey(n), what)
	if err != nil && rev == 0 {
		return nil, fmt.Errorf("capstan: %s: %w", what, err)
	}
	return v, err
}

// History returns every version the bucket holds, oldest first.
func History(ctx context.Context, nc *nats.Conn, kv jetstream.KeyValue) ([]*Version, error) {
	ns, err := versions(ctx, kv)
	if err != nil {
		return nil, err
	}
	var out []*Version
	for _, n := range ns {
		v, err := ReadVersion(ctx, nc, kv, n)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *Version) int { return a.Version - b.Version })
	return out, nil
}

// versions lists the numbers of the versions the bucket holds.
func versions(ctx context.Context, kv jetstream.KeyValue) ([]int, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = keys.Stop() }()
	var out []int
	for k := range keys.Keys() {
		if n, err := strconv.Atoi(strings.TrimPrefix(k, "v.")); strings.HasPrefix(k, "v.") && err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// Change is what Apply or Remove did.
type Change struct {
	// Current is what is in force now; Previous what was.
	Current  *Current `json:"current"`
	Previous *Current `json:"previous"`
	// Version is the set applied (nil for a removal).
	Version *Version `json:"version,omitempty"`
	// Revision is the bucket's revision of the change: a worker whose copy
	// has it evaluates the version.
	Revision uint64 `json:"revision"`
	// AuditID is the trail's id of the change, under By.
	AuditID string `json:"auditId"`
}

// Applying is a set an admin puts in force.
type Applying struct {
	// File names the set, Text is it.
	File string
	Text []byte
	// Catalog is what it is validated against: every capability of the
	// deployment.
	Catalog []Capability
	// By, Operator and Reason say who and why.
	By, Operator, Reason string
}

// Apply validates a set against the catalog and puts it in force as a new
// version: refused whole, nothing changed, when it does not parse or
// validate. Its event goes on the trail first (acknowledged), then the
// version is written, then put in force by compare-and-swap.
func Apply(ctx context.Context, nc *nats.Conn, n broker.Names, a Applying) (*Change, error) {
	if strings.TrimSpace(a.Reason) == "" {
		return nil, errors.New("a reason is required: it goes on the trail")
	}
	set, err := Compile(a.File, a.Text)
	if err != nil {
		return nil, err
	}
	if err := set.Validate(a.Catalog); err != nil {
		return nil, fmt.Errorf("%s does not validate against the catalog's schemas (capstan policy schema prints them):\n%w", a.File, err)
	}
	kv, prev, prevRev, _, err := open(ctx, nc, n, true)
	if err != nil {
		return nil, err
	}
	latest, err := newest(ctx, kv, prev)
	if err != nil {
		return nil, err
	}
	v := &Version{V: envelope.Version, Version: latest + 1, Text: string(a.Text), SHA256: set.SHA256, Rules: set.Rules(),
		Policies: set.Names(), File: a.File, By: a.By, Operator: a.Operator, At: time.Now().UTC(), Reason: a.Reason,
		AuditID: envelope.NewExecutionID()}
	cur := &Current{V: envelope.Version, Version: v.Version, Latest: v.Version, SHA256: v.SHA256, By: a.By,
		Operator: a.Operator, At: v.At, Reason: a.Reason, AuditID: v.AuditID}
	data := map[string]any{"version": v.Version, "previousVersion": prev.Version, "sha256": v.SHA256, "rules": v.Rules,
		"policies": v.Policies, "reason": a.Reason, "file": a.File}
	return change(ctx, nc, n, kv, prev, prevRev, cur, v, data)
}

// Remove takes the set in force out of force: calls are decided as with no
// Cedar policy at all. Its versions stay in the bucket.
func Remove(ctx context.Context, nc *nats.Conn, n broker.Names, by, operator, reason string) (*Change, error) {
	if strings.TrimSpace(reason) == "" {
		return nil, errors.New("a reason is required: it goes on the trail")
	}
	kv, prev, prevRev, spoiled, err := open(ctx, nc, n, false)
	if errors.Is(err, jetstream.ErrBucketNotFound) || err == nil && prev.Version == 0 && !spoiled {
		return nil, errors.New("no policy set is in force")
	}
	if err != nil {
		return nil, err
	}
	latest, err := newest(ctx, kv, prev)
	if err != nil {
		return nil, err
	}
	cur := &Current{V: envelope.Version, Latest: latest, By: by, Operator: operator, At: time.Now().UTC(), Reason: reason,
		AuditID: envelope.NewExecutionID()}
	data := map[string]any{"version": 0, "previousVersion": prev.Version, "reason": reason}
	return change(ctx, nc, n, kv, prev, prevRev, cur, nil, data)
}

// open opens the bucket and reads what is in force. A current key that
// does not decode (spoiled: written by hand, or in another shape) reads as
// nothing in force, with its revision, so that an apply or a removal
// replaces it: every worker fails every call closed until one does.
func open(ctx context.Context, nc *nats.Conn, n broker.Names, create bool) (kv jetstream.KeyValue, cur *Current, rev uint64, spoiled bool, err error) {
	if kv, err = oplog.OpenBucket(ctx, nc, n.PoliciesBucket(), create); err != nil {
		return nil, nil, 0, false, err
	}
	err = oplog.Retry(ctx, func(ctx context.Context) (err error) {
		cur, rev, err = ReadCurrent(ctx, nc, kv)
		return err
	})
	if err != nil && rev > 0 {
		return kv, &Current{}, rev, true, nil
	}
	return kv, cur, rev, false, err
}

// newest is the newest version the bucket holds: what is in force says it,
// unless an apply stopped between its two writes left a newer one, never in
// force, whose number the next apply must skip (or be refused for ever).
func newest(ctx context.Context, kv jetstream.KeyValue, cur *Current) (int, error) {
	latest := cur.Latest
	if err := oplog.Retry(ctx, func(ctx context.Context) error {
		ns, err := versions(ctx, kv)
		for _, n := range ns {
			latest = max(latest, n)
		}
		return err
	}); err != nil {
		return 0, fmt.Errorf("capstan: list the policy versions: %w", err)
	}
	return latest, nil
}

// change files the change on the trail, writes the version (if any), and
// swaps what is in force.
func change(ctx context.Context, nc *nats.Conn, n broker.Names, kv jetstream.KeyValue, prev *Current, prevRev uint64,
	cur *Current, v *Version, data map[string]any) (*Change, error) {
	log := oplog.New(nc, n, cur.By, cur.Operator)
	if err := log.Record(ctx, audit.EventPoliciesApplied, cur.AuditID, "", data); err != nil {
		return nil, fmt.Errorf("capstan: nothing changed: the audit trail did not take the event: %w", err)
	}
	notApplied := func(cause error) error {
		return log.NotApplied(ctx, cur.AuditID, "", "policies", cause,
			fmt.Errorf("%w: another operator changed the policies; nothing changed (run the command again)", ErrChanged))
	}
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		if _, err := oplog.Write(ctx, kv, versionKey(v.Version), b, 0, func(ctx context.Context) (uint64, bool) {
			have, err := ReadVersion(ctx, nc, kv, v.Version)
			return 0, err == nil && have.AuditID == v.AuditID
		}); err != nil {
			return nil, notApplied(err)
		}
	}
	b, err := json.Marshal(cur)
	if err != nil {
		return nil, err
	}
	rev, err := oplog.Write(ctx, kv, currentKey, b, prevRev, func(ctx context.Context) (uint64, bool) {
		have, r, err := ReadCurrent(ctx, nc, kv)
		return r, err == nil && have.AuditID == cur.AuditID
	})
	if err != nil {
		return nil, notApplied(err)
	}
	return &Change{Current: cur, Previous: prev, Version: v, Revision: rev, AuditID: cur.AuditID}, nil
}
