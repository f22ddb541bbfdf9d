package natsserver

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// readyTimeout bounds how long Start waits for the server to accept clients.
const readyTimeout = 10 * time.Second

// Options configures an embedded JetStream server. Zero values are the defaults.
type Options struct {
	// StoreDir is the JetStream file store directory. Required.
	StoreDir string
	// Host is the client listen host; default "127.0.0.1".
	Host string
	// Port is the client listen port: 0 means 4222, -1 a random free port.
	Port int
	// Name is the server name, which must be unique within a cluster and stable
	// across restarts of a clustered node (it is the node's identity in the
	// JetStream meta group). Default: "<hostname>-<port>", or, with a random
	// port, "<hostname>-<hash of the store directory>".
	Name string
	// ClusterName defaults to "capstan" when Routes or a cluster listen port is set.
	ClusterName string
	// ClusterHost and ClusterPort are the route listen address; ClusterPort 0 means
	// no route listener, -1 a random free port. ClusterHost defaults to Host.
	ClusterHost string
	ClusterPort int
	// Routes are the other nodes' route URLs, e.g. "nats://127.0.0.1:6222".
	Routes []string
	// SyncAlways makes JetStream fsync every write before acknowledging it
	// (sync_interval "always").
	SyncAlways bool
	// MaxMemory and MaxStore limit JetStream storage in bytes; 0 = server defaults.
	MaxMemory, MaxStore int64
	// Logger receives the server's logs. Nil: no logs.
	Logger *slog.Logger
	// ConfigFile is a nats-server configuration (for instance the one capstan
	// auth writes) read first; the fields above override what it says about
	// listening, clustering and JetStream.
	ConfigFile string
	// ResolverDir, with a ConfigFile whose account resolver keeps accounts
	// in a directory (capstan auth's full resolver), is where this server
	// keeps them instead: each server of a cluster, and each store, needs
	// its own.
	ResolverDir string
	// TLS, when set, is the client listener's TLS configuration: the server
	// then speaks only TLS to clients, and verifies their certificates when
	// its ClientAuth asks for them.
	TLS *tls.Config
}

// Start starts an embedded nats-server with JetStream and waits until it accepts
// client connections. On failure the server is shut down and the error says why.
func Start(opts Options) (*server.Server, error) {
	sopts, err := serverOptions(opts)
	if err != nil {
		return nil, err
	}
	s, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: configure server: %w", err)
	}
	logger := newLogAdapter(opts.Logger)
	ctx := context.Background()
	debug := opts.Logger != nil && opts.Logger.Enabled(ctx, slog.LevelDebug)
	trace := opts.Logger != nil && opts.Logger.Enabled(ctx, levelTrace)
	s.SetLoggerV2(logger, debug, trace, false)

	s.Start()
	if err := waitReady(s, logger); err != nil {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, fmt.Errorf("natsserver: start %q (store %s): %w", sopts.ServerName, sopts.StoreDir, err)
	}
	return s, nil
}

// ClientURL returns the URL clients use to reach s. An unspecified listen host
// (0.0.0.0, ::) is replaced with loopback so the URL can be dialed locally.
func ClientURL(s *server.Server) string {
	addr, ok := s.Addr().(*net.TCPAddr)
	if !ok || addr == nil {
		return s.ClientURL()
	}
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "nats://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
}

func serverOptions(opts Options) (*server.Options, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("natsserver: Options.StoreDir is required")
	}
	storeDir, err := filepath.Abs(opts.StoreDir)
	if err != nil {
		return nil, fmt.Errorf("natsserver: store dir: %w", err)
	}
	host := opts.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := opts.Port
	if port == 0 {
		port = server.DEFAULT_PORT
	}
	name := opts.Name
	if name == "" {
		name = defaultName(port, storeDir)
	}

	sopts := &server.Options{}
	if opts.ConfigFile != "" {
		if sopts, err = server.ProcessConfigFile(opts.ConfigFile); err != nil {
			return nil, fmt.Errorf("natsserver: %w", err)
		}
		if err := ownResolverDir(sopts, opts.ResolverDir); err != nil {
			return nil, err
		}
	}
	sopts.ServerName = name
	sopts.Host = host
	sopts.Port = port
	sopts.JetStream = true
	sopts.StoreDir = storeDir
	sopts.SyncAlways = opts.SyncAlways
	sopts.JetStreamMaxMemory = opts.MaxMemory
	sopts.JetStreamMaxStore = opts.MaxStore
	sopts.NoSigs = true // the embedding process owns its signals
	if opts.TLS != nil {
		sopts.TLS, sopts.TLSConfig = true, opts.TLS
		sopts.TLSVerify = opts.TLS.ClientAuth == tls.RequireAndVerifyClientCert
		sopts.TLSTimeout = 5
	}

	if opts.ClusterPort != 0 || len(opts.Routes) > 0 {
		sopts.Cluster.Name = opts.ClusterName
		if sopts.Cluster.Name == "" {
			sopts.Cluster.Name = "capstan"
		}
		sopts.Cluster.Host = opts.ClusterHost
		if sopts.Cluster.Host == "" {
			sopts.Cluster.Host = host
		}
		sopts.Cluster.Port = opts.ClusterPort
		for _, r := range opts.Routes {
			u, err := url.Parse(strings.TrimSpace(r))
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("natsserver: invalid route URL %q (want nats://host:port)", r)
			}
			sopts.Routes = append(sopts.Routes, u)
		}
	}
	return sopts, nil
}

// ownResolverDir replaces a directory resolver read from a configuration
// with one keeping its accounts in dir.
func ownResolverDir(sopts *server.Options, dir string) error {
	if dir == "" {
		return nil
	}
	if _, ok := sopts.AccountResolver.(*server.DirAccResolver); !ok {
		return nil
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("natsserver: resolver dir: %w", err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return fmt.Errorf("natsserver: resolver dir: %w", err)
	}
	r, err := server.NewDirAccResolver(abs, 0, resolverSync, server.NoDelete)
	if err != nil {
		return fmt.Errorf("natsserver: resolver dir %s: %w", abs, err)
	}
	sopts.AccountResolver.Close()
	sopts.AccountResolver = r
	return nil
}

// resolverSync is how often the nodes of a cluster compare the accounts
// their resolvers hold (a node that missed a push catches up).
const resolverSync = 2 * time.Minute

// defaultName gives a name that is stable across restarts of the same node, so
// a clustered node keeps its identity in the JetStream meta group.
func defaultName(port int, storeDir string) string {
	hostname, err := os.Hostname()
	if err != nil || hostname == "" {
		hostname = "capstan"
	}
	if port > 0 {
		return hostname + "-" + strconv.Itoa(port)
	}
	sum := sha256.Sum256([]byte(storeDir))
	return hostname + "-" + hex.EncodeToString(sum[:4])
}

// waitReady waits until s accepts clients, returning early with the server's own
// fatal message when startup fails (for instance a busy port or a bad store dir).
func waitReady(s *server.Server, logger *logAdapter) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case msg := <-logger.fatal:
			return errors.New(msg)
		default:
		}
		if s.ReadyForConnections(50 * time.Millisecond) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready for connections after %s", readyTimeout)
		}
	}
}
