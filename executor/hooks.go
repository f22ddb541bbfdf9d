package executor

import (
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/testhooks"
)

func init() {
	testhooks.ClientBroker = func(c any) *broker.Broker { return c.(*Client).b }
	testhooks.WorkerKnobsOf = func(cfg any) *testhooks.WorkerKnobs { return &cfg.(*WorkerConfig).knobs }
}
