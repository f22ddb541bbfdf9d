package testenv

import (
	"flag"
	"runtime"
	"strconv"
)

// Tests that call t.Parallel run, per CPU, this many at once (RaiseParallel):
// fewer under the race detector, which multiplies what each one computes.
const (
	parallelPerCPU     = 4
	parallelPerCPURace = 2
)

// RaiseParallel lets more of a package's parallel tests run at once than go
// test's default, one per CPU: 4 per CPU, 2 under the race detector. Tests
// on embedded JetStream servers wait — for leases, TTLs, redeliveries and
// elections — far more than they compute, and one per CPU leaves the
// machine idle while they wait. A -parallel given to go test wins. Call it
// from TestMain, before m.Run.
func RaiseParallel() {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given || flag.Lookup("test.parallel") == nil {
		return
	}
	perCPU := parallelPerCPU
	if raceEnabled {
		perCPU = parallelPerCPURace
	}
	_ = flag.Set("test.parallel", strconv.Itoa(perCPU*runtime.GOMAXPROCS(0)))
}
