package console

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/capstan-dev/capstan/audit"
	"github.com/capstan-dev/capstan/internal/broker"
)

// maxScan bounds how many audit events one listing reads: the newest ones
// when the window holds more.
const maxScan = 20000

var errScanned = errors.New("scanned")

// scanAudit calls fn with every audit event stored since t, oldest first, up
// to the end of the stream as it is when the scan starts, and at most the
// newest maxScan of them. It reads through audit.Follow's one ephemeral
// consumer, which is deleted on return.
func scanAudit(ctx context.Context, b *broker.Broker, since time.Time, fn func(ev *audit.Event)) error {
	info, err := b.Audit.Info(ctx)
	if err != nil {
		return fmt.Errorf("capstan: audit stream: %w", err)
	}
	st := info.State
	if st.Msgs == 0 || st.LastTime.Before(since) {
		return nil
	}
	last := st.LastSeq
	from := audit.Since(since)
	if last > maxScan && st.FirstSeq < last-maxScan {
		// Find where the window starts; skip to the newest maxScan if it holds more.
		first := uint64(0)
		ferr := audit.Follow(ctx, b, audit.Filter{}, func(ev audit.Event) error {
			first = ev.Seq
			return errScanned
		}, audit.Since(since))
		if ferr != nil && !errors.Is(ferr, errScanned) {
			return ferr
		}
		if first != 0 && last-first >= maxScan {
			from = audit.FromSeq(last - maxScan + 1)
		}
	}
	err = audit.Follow(ctx, b, audit.Filter{}, func(ev audit.Event) error {
		fn(&ev)
		if ev.Seq >= last {
			return errScanned
		}
		return nil
	}, from)
	if err != nil && !errors.Is(err, errScanned) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("capstan: reading the audit stream: %w", ctx.Err())
	}
	return nil
}

// intOf reads a number of an event's data, whatever width msgpack gave it.
func intOf(v any) int {
	switch n := reflect.ValueOf(v); {
	case n.CanInt():
		return int(n.Int())
	case n.CanUint():
		return int(n.Uint())
	case n.CanFloat():
		return int(n.Float())
	}
	return 0
}

func strOf(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}
