package telemetry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"
)

// Serve listens on addr (host:port; port 0 picks a free one) and serves the
// metrics on /metrics until ctx ends. It returns the address it listens on
// once it does, and a channel that receives the server's end (nil after ctx
// ended).
func (t *Telemetry) Serve(ctx context.Context, addr string) (net.Addr, <-chan error, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", t.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(l)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return l.Addr(), done, nil
}
