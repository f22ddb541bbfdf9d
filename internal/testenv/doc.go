// Package testenv runs real NATS JetStream servers, embedded in the test process,
// for capstan's tests: one server, or a cluster of several, on loopback, each with
// a file store under the test's temporary directory. Everything it starts is shut
// down when the test ends.
//
// The smallest use:
//
//	func TestSomething(t *testing.T) {
//		env := testenv.Start(t)
//		js := env.JetStream(t)
//		// ... create streams, run a worker against env.URL ...
//	}
//
// Crash-like tests call Stop and Restart (same store, same port; clients
// reconnect), and StartCluster, StopNode and RestartNode for a 3-node cluster.
//
// Each test owns its servers, so tests call t.Parallel; a package's TestMain
// calls RaiseParallel to run several per CPU, as they mostly wait:
//
//	func TestMain(m *testing.M) {
//		testenv.RaiseParallel()
//		os.Exit(m.Run())
//	}
package testenv
