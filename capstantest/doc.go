// Package capstantest gives a test a running capstan worker in one line: a
// worker serving the test's registry on a fresh embedded JetStream server,
// started, serving, and stopped when the test ends, with clients to
// call it. Each test owns its server, so tests that use it run in parallel.
//
//	func TestGreet(t *testing.T) {
//		t.Parallel()
//		reg, err := executor.NewRegistry(greet)
//		if err != nil {
//			t.Fatal(err)
//		}
//		w := capstantest.Worker(t, reg)
//		c := w.Client(t, executor.ClientConfig{Actor: ada})
//		env, err := c.Call(t.Context(), "greet.hello", Greeting{Name: "Ada"})
//		if err != nil || env.Status != envelope.StatusCompleted {
//			t.Fatalf("%v %+v", err, env)
//		}
//	}
//
// Worker returns once the worker serves: once the catalog lists every
// capability of the registry, which a worker writes as it starts. A worker
// that stops on an error fails the test with it. WithConfig gives the worker
// its configuration (its pool, lease, logger, broker prefix); WithConn runs it
// over a connection the test made, to a server of its own (a cluster, a
// server with authentication, where the worker connects as the worker
// principal). Server starts a server alone, for a test of a program that
// connects by URL; Running.Connect connects to the worker's server, for a
// second worker on it.
//
// It is a package for tests: it imports testing and links the embedded
// server. Programs import executor.
package capstantest
