// Package natsserver starts an embedded nats-server with JetStream enabled.
//
// It is machinery shared by the `capstan dev` and `capstan server` commands and by
// the testenv package: one place that turns a handful of capstan settings (store
// directory, listen address, cluster routes, fsync policy) into nats-server options,
// starts the server and waits until it accepts clients.
//
//	s, err := natsserver.Start(natsserver.Options{StoreDir: dir, Port: -1})
//	if err != nil {
//		return err
//	}
//	defer func() { s.Shutdown(); s.WaitForShutdown() }()
//	nc, err := nats.Connect(natsserver.ClientURL(s))
package natsserver
