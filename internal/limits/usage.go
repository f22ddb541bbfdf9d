package limits

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/nats-io/nats.go/jetstream"
)

// Usage is one counter's usage against its limit, now: what `capstan limits`,
// the metrics and the console show.
type Usage struct {
	Key        string    `json:"key"`
	Capability string    `json:"capability"`
	Kind       Kind      `json:"kind"`
	Per        Per       `json:"per,omitempty"`
	Who        string    `json:"who,omitempty"`
	Name       string    `json:"name,omitempty"`
	Limit      string    `json:"limit"`
	Max        int64     `json:"max"`
	Used       int64     `json:"used"`
	IntervalMs int64     `json:"intervalMs,omitempty"`
	Holders    []Holder  `json:"holders,omitempty"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

// Read reads every counter of the limits bucket kv whose capability starts
// with prefix ("" for all), sorted by capability, kind and whose. A
// deployment whose bucket does not exist yet has none.
func Read(ctx context.Context, kv jetstream.KeyValue, prefix string, now time.Time) ([]Usage, error) {
	if kv == nil {
		return nil, nil
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Usage
	for key := range keys.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue // expired since it was listed
		}
		if err != nil {
			return nil, err
		}
		var c Counter
		if err := envelope.Unmarshal(e.Value(), &c); err != nil {
			continue // not a counter this version reads
		}
		if !strings.HasPrefix(c.Capability, prefix) {
			continue
		}
		out = append(out, c.usage(key, now))
	}
	slices.SortFunc(out, func(a, b Usage) int {
		return strings.Compare(a.Capability+"\x00"+string(a.Kind)+"\x00"+a.Who+"\x00"+a.Name,
			b.Capability+"\x00"+string(b.Kind)+"\x00"+b.Who+"\x00"+b.Name)
	})
	return out, nil
}

func (c *Counter) usage(key string, now time.Time) Usage {
	return Usage{Key: key, Capability: c.Capability, Kind: c.Kind, Per: c.Per, Who: c.Who, Name: c.Name,
		Limit: c.Limit().String(), Max: c.Max, Used: c.Used(now), IntervalMs: c.IntervalMs, Holders: c.Holders,
		UpdatedAt: c.UpdatedAt}
}
