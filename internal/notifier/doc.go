// Package notifier is the process behind capstan notify and capstan worker
// --notify: it reads the changes of approvals through one durable consumer
// per channel, decides what each revision calls for, and delivers it to
// webhooks, Slack incoming webhooks and mail servers, retrying, counting and
// never printing a secret.
//
//	cfg, err := notifier.LoadFile("notify.json") // refused unless chmod 600
//	cfg.Provision = true                          // create the consumers (a worker's or an admin's right)
//	n, err := notifier.New(nc, cfg)
//	n.Register(tel.Registry())                    // its counts on a scrape
//	err = n.Run(ctx)                              // until ctx ends
//
// What it sends and when, the configuration file and the credentials it
// needs are described for users in package notify, whose Payload and Verify
// are the receiver's side of a webhook channel.
package notifier
