package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// servePprof serves the Go runtime's profiles (heap, goroutines, CPU, …)
// under /debug/pprof/ on addr, which must be a loopback address: a profile
// shows the process's memory. It returns the address it listens on and what
// stops it.
func servePprof(addr string) (string, func(), error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof %q: want host:port", addr)
	}
	if !loopback(host) {
		return "", nil, fmt.Errorf("--pprof %q: profiles are served on a loopback address only", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("--pprof: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Printf("capstan: pprof: %v\n", err)
		}
	}()
	return l.Addr().String(), func() { _ = srv.Close() }, nil
}
