package notifier

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"
)

// Kind is what a channel delivers to.
type Kind string

// Kinds of channels.
const (
	// KindWebhook POSTs the Payload as JSON, signed (see Sign).
	KindWebhook Kind = "webhook"
	// KindSlack POSTs a message to a Slack-compatible incoming webhook.
	KindSlack Kind = "slack"
	// KindEmail sends a plain-text message over SMTP.
	KindEmail Kind = "email"
)

// TLSMode says how an email channel protects its SMTP connection.
type TLSMode string

// TLS modes of an SMTP connection.
const (
	// TLSModeStartTLS (the default) upgrades the connection when the server offers
	// it, and refuses to send beyond loopback when it does not.
	TLSModeStartTLS TLSMode = "starttls"
	// TLSModeImplicit speaks TLS from the first byte (SMTPS, usually port 465).
	TLSModeImplicit TLSMode = "implicit"
	// TLSModeOptional upgrades when offered and otherwise sends in clear, even
	// beyond loopback: only where the network itself is trusted. AUTH is
	// still never sent in clear beyond loopback.
	TLSModeOptional TLSMode = "optional"
)

// Secret is a value that must never be printed: a webhook's signing key, a
// URL that carries a token, an SMTP password. It prints, logs and marshals
// as "[redacted]"; reveal returns it.
type Secret string

const redacted = "[redacted]"

// reveal returns the secret itself, for the one place that uses it.
func (s Secret) reveal() string { return string(s) }

// String hides the secret from fmt's %s and %v.
func (s Secret) String() string { return redacted }

// GoString hides the secret from fmt's %#v.
func (s Secret) GoString() string { return redacted }

// LogValue hides the secret from log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalJSON hides the secret from encoding/json.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// Config configures a Notifier. Zero values are the defaults.
type Config struct {
	// ID names this notifier in its log lines and status (default
	// notify-<host>-<pid>).
	ID string
	// Prefix of capstan's names (default "CAPSTAN").
	Prefix string
	// ConsoleURL is the console's base URL (https://capstan.example.com):
	// every message links to ConsoleURL/approvals/<id>. Empty: no link.
	ConsoleURL string
	// Channels receive the notifications of the approval types they list.
	Channels []Channel
	// Retry bounds the retries of one notification on one channel.
	Retry Retry
	// Timeout bounds one attempt of one delivery (default 10 s).
	Timeout time.Duration
	// Concurrency is how many approvals one notifier works on at once for
	// each channel (default 64).
	Concurrency int
	// Provision creates the channels' notify consumers when missing, which needs
	// the right to create consumers (a worker's or an admin's credentials).
	// Without it, a missing consumer is an error that says how to create it.
	Provision bool
	// NoStatus leaves status requests (capstan notify --status) unanswered.
	NoStatus bool
	// Logger receives what goes wrong (default slog.Default()). Secrets are
	// never in its lines.
	Logger *slog.Logger `json:"-"`
}

// Retry is the exponential backoff of one delivery: attempt n waits
// min(Initial × 2^(n-1), Max) after attempt n-1 failed, up to Attempts in all.
type Retry struct {
	// Attempts in all, the first included (default 12).
	Attempts int
	// Initial is the wait after the first failure (default 2 s).
	Initial time.Duration
	// Max caps one wait (default 10 min).
	Max time.Duration
}

// Defaults of Retry: 12 attempts over about 37 minutes.
const (
	defaultAttempts = 12
	defaultInitial  = 2 * time.Second
	defaultMax      = 10 * time.Minute
	defaultTimeout  = 10 * time.Second
)

func (r Retry) withDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = defaultAttempts
	}
	if r.Initial <= 0 {
		r.Initial = defaultInitial
	}
	if r.Max <= 0 {
		r.Max = defaultMax
	}
	r.Max = max(r.Max, r.Initial)
	return r
}

// Channel is one destination of notifications.
type Channel struct {
	// Name identifies the channel in logs, metrics and status: a short token
	// ([a-z0-9_-]).
	Name string `json:"name"`
	Kind Kind   `json:"kind"` // KindWebhook, KindSlack or KindEmail; required
	// Types are the approval types whose notifications the channel
	// receives; "*" is every approval, those without types included. An
	// approval of several types reaches every channel that lists one.
	Types []string `json:"types"`
	// URL is where a webhook or Slack channel posts. It must be https
	// beyond loopback, unless AllowHTTP.
	URL       Secret `json:"url,omitzero"`
	AllowHTTP bool   `json:"allowHttp,omitzero"` // permits a plain http URL beyond loopback (the payload then travels in clear)
	// Secret is a webhook's HMAC-SHA256 key (at least 16 bytes).
	Secret Secret `json:"secret,omitzero"`
	// SMTP, From and To configure an email channel.
	SMTP SMTP     `json:"smtp,omitzero"`
	From string   `json:"from,omitzero"` // the sender's address, required for email
	To   []string `json:"to,omitzero"`   // the recipients' addresses, at least one for email
}

// SMTP is how an email channel reaches its mail server.
type SMTP struct {
	Host string `json:"host"` // the mail server's host name or address; required
	// Port defaults to 587 (465 with TLSModeImplicit).
	Port int `json:"port,omitzero"`
	// Username and Password authenticate with AUTH PLAIN; empty: no AUTH.
	Username string  `json:"username,omitzero"`
	Password Secret  `json:"password,omitzero"` // see Username; never sent in clear beyond loopback
	TLS      TLSMode `json:"tls,omitzero"`      // TLSModeStartTLS (when empty), TLSModeImplicit or TLSModeOptional
	// TLSConfig, when set, is the TLS configuration (its ServerName
	// defaults to Host); CAFile in the configuration file adds a root.
	TLSConfig *tls.Config `json:"-"`
}

// ErrConfig marks a configuration that cannot be used.
var ErrConfig = errors.New("capstan: invalid notify configuration")

// LoadFile reads a JSON configuration file (see the package documentation
// for its format), refusing one that anyone but its owner may read or write:
// it may hold secrets. Fields ending in "Env" name environment variables that
// hold the secret instead.
func LoadFile(path string) (Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if err := checkMode(path, st.Mode()); err != nil {
		return Config{}, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return parse(b, os.Getenv, path)
}

// checkMode refuses a file that group or others may access. Windows keeps
// no such bits: its ACLs are the operator's to set.
func checkMode(path string, mode fs.FileMode) error {
	if runtime.GOOS == "windows" || mode.Perm()&0o077 == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s may be read by others (mode %#o) and it may hold secrets: make it readable by its owner only (chmod 600 %s)",
		ErrConfig, path, mode.Perm(), path)
}

// fileConfig is the configuration file's shape.
type fileConfig struct {
	ConsoleURL string        `json:"consoleUrl"`
	Timeout    duration      `json:"timeout"`
	Retry      fileRetry     `json:"retry"`
	Channels   []fileChannel `json:"channels"`
}

type fileRetry struct {
	Attempts int      `json:"attempts"`
	Initial  duration `json:"initial"`
	Max      duration `json:"max"`
}

type fileChannel struct {
	Name      string   `json:"name"`
	Kind      Kind     `json:"kind"`
	Types     []string `json:"types"`
	URL       string   `json:"url"`
	URLEnv    string   `json:"urlEnv"`
	AllowHTTP bool     `json:"allowHttp"`
	Secret    string   `json:"secret"`
	SecretEnv string   `json:"secretEnv"`
	SMTP      fileSMTP `json:"smtp"`
	From      string   `json:"from"`
	To        []string `json:"to"`
}

type fileSMTP struct {
	Host        string  `json:"host"`
	Port        int     `json:"port"`
	Username    string  `json:"username"`
	Password    string  `json:"password"`
	PasswordEnv string  `json:"passwordEnv"`
	TLS         TLSMode `json:"tls"`
	CAFile      string  `json:"caFile"`
}

// duration is a Go duration string in JSON ("2s", "10m").
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`want a duration such as "10s"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("%q is not a duration such as \"10s\"", s)
	}
	*d = duration(v)
	return nil
}

// parse reads a configuration from source (a file's path, or "").
func parse(b []byte, getenv func(string) string, source string) (Config, error) {
	invalid := func(err error) error {
		if source != "" {
			return fmt.Errorf("%w: %s: %w", ErrConfig, source, err)
		}
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var f fileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Config{}, invalid(errors.New(jsonError(err)))
	}
	cfg := Config{
		ConsoleURL: f.ConsoleURL, Timeout: time.Duration(f.Timeout),
		Retry: Retry{Attempts: f.Retry.Attempts, Initial: time.Duration(f.Retry.Initial), Max: time.Duration(f.Retry.Max)},
	}
	var errs []error
	for i, fc := range f.Channels {
		name := fc.Name
		if name == "" {
			name = fmt.Sprintf("#%d", i+1)
		}
		secret := func(field, inline, env string) Secret {
			switch {
			case inline != "" && env != "":
				errs = append(errs, fmt.Errorf("channel %s: %s and %sEnv both set: keep one", name, field, field))
			case env != "":
				v := getenv(env)
				if v == "" {
					errs = append(errs, fmt.Errorf("channel %s: %sEnv names %s, which is not set", name, field, env))
				}
				return Secret(v)
			}
			return Secret(inline)
		}
		c := Channel{
			Name: fc.Name, Kind: fc.Kind, Types: fc.Types, AllowHTTP: fc.AllowHTTP,
			URL:    secret("url", fc.URL, fc.URLEnv),
			Secret: secret("secret", fc.Secret, fc.SecretEnv),
			From:   fc.From, To: fc.To,
			SMTP: SMTP{Host: fc.SMTP.Host, Port: fc.SMTP.Port, Username: fc.SMTP.Username, TLS: fc.SMTP.TLS,
				Password: secret("password", fc.SMTP.Password, fc.SMTP.PasswordEnv)},
		}
		if fc.SMTP.CAFile != "" {
			pem, err := os.ReadFile(fc.SMTP.CAFile)
			pool := x509.NewCertPool()
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("channel %s: smtp.caFile: %v", name, err))
			case !pool.AppendCertsFromPEM(pem):
				errs = append(errs, fmt.Errorf("channel %s: smtp.caFile %s holds no PEM certificate", name, fc.SMTP.CAFile))
			default:
				c.SMTP.TLSConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
			}
		}
		cfg.Channels = append(cfg.Channels, c)
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, invalid(err)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, invalid(err)
	}
	return cfg, nil
}

// jsonError says what encoding/json found without quoting the document: a
// value it quotes may be a secret.
func jsonError(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "not JSON: the document ends early"
	case errors.As(err, &syn):
		return fmt.Sprintf("not JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		return fmt.Sprintf("field %s: want %s, not a JSON %s", typ.Field, typ.Type, typ.Value)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return strings.TrimPrefix(err.Error(), "json: ")
	}
	return "the file is not a configuration: " + strings.TrimPrefix(err.Error(), "json: ")
}

// check reports every problem of cfg at once, naming fields and never
// quoting a secret.
func (cfg Config) check() error {
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return nil
}

func (cfg Config) validate() error {
	var errs []error
	if cfg.ConsoleURL != "" {
		if u, err := url.Parse(cfg.ConsoleURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, errors.New("consoleUrl: want an http or https URL such as https://capstan.example.com"))
		}
	}
	if len(cfg.Channels) == 0 {
		errs = append(errs, errors.New("no channels: a notifier needs at least one"))
	}
	seen := map[string]bool{}
	for _, c := range cfg.Channels {
		if seen[c.Name] {
			errs = append(errs, fmt.Errorf("channel %s: two channels have this name", c.Name))
		}
		seen[c.Name] = true
		if err := c.validate(); err != nil {
			errs = append(errs, fmt.Errorf("channel %s: %w", c.Name, err))
		}
	}
	if cfg.Retry.Attempts < 0 || cfg.Retry.Initial < 0 || cfg.Retry.Max < 0 || cfg.Timeout < 0 || cfg.Concurrency < 0 {
		errs = append(errs, errors.New("retry and timeout: want positive values (zero: the default)"))
	}
	return errors.Join(errs...)
}

func (c Channel) validate() error {
	var errs []error
	if !validName(c.Name) {
		errs = append(errs, errors.New("name: want [a-z0-9_-], 1 to 64 bytes"))
	}
	if len(c.Types) == 0 {
		errs = append(errs, errors.New(`types: list the approval types it receives, or "*" for every one`))
	}
	for _, t := range c.Types {
		if t == "" {
			errs = append(errs, errors.New("types: an empty type"))
		}
	}
	switch c.Kind {
	case KindWebhook, KindSlack:
		if err := checkURL(c.URL.reveal(), c.AllowHTTP); err != nil {
			errs = append(errs, err)
		}
		if c.Kind == KindWebhook && len(c.Secret.reveal()) < 16 {
			errs = append(errs, errors.New("secret: a webhook is signed with a key of at least 16 bytes (secret or secretEnv)"))
		}
		if c.Kind == KindSlack && c.Secret != "" {
			errs = append(errs, errors.New("secret: a Slack webhook is not signed; its URL is the secret"))
		}
		if c.SMTP.Host != "" || c.From != "" || len(c.To) > 0 {
			errs = append(errs, fmt.Errorf("smtp, from and to belong to an email channel, not a %s one", c.Kind))
		}
	case KindEmail:
		if c.URL != "" || c.Secret != "" {
			errs = append(errs, errors.New("url and secret belong to webhook and Slack channels"))
		}
		if c.SMTP.Host == "" {
			errs = append(errs, errors.New("smtp.host: the mail server"))
		}
		if c.SMTP.Port < 0 || c.SMTP.Port > 65535 {
			errs = append(errs, errors.New("smtp.port: want 1 to 65535"))
		}
		switch c.SMTP.TLS {
		case "", TLSModeStartTLS, TLSModeImplicit, TLSModeOptional:
		default:
			errs = append(errs, fmt.Errorf("smtp.tls %q: want starttls, implicit or optional", c.SMTP.TLS))
		}
		if c.SMTP.Password != "" && c.SMTP.Username == "" {
			errs = append(errs, errors.New("smtp.password without smtp.username"))
		}
		if _, err := mail.ParseAddress(c.From); err != nil {
			errs = append(errs, fmt.Errorf("from %q: want an email address", c.From))
		}
		if len(c.To) == 0 {
			errs = append(errs, errors.New("to: at least one address"))
		}
		for _, to := range c.To {
			if _, err := mail.ParseAddress(to); err != nil {
				errs = append(errs, fmt.Errorf("to %q: want an email address", to))
			}
		}
	default:
		errs = append(errs, fmt.Errorf("kind %q: want webhook, slack or email", c.Kind))
	}
	return errors.Join(errs...)
}

// checkURL accepts an https URL, or an http one on loopback or with
// allowHTTP. Its errors never quote the URL: its path may be the secret.
func checkURL(raw string, allowHTTP bool) error {
	if raw == "" {
		return errors.New("url: where to post (url or urlEnv)")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return errors.New("url: not an http or https URL")
	}
	if u.User != nil {
		return errors.New("url: credentials in the URL: put them in the path or use a webhook secret")
	}
	if u.Scheme == "http" && !allowHTTP && !loopback(u.Hostname()) {
		return fmt.Errorf("url: http to %s would send approvals in clear: use https, or set allowHttp", u.Hostname())
	}
	return nil
}

// loopback reports whether host names this machine: localhost or a loopback
// address. Nothing is resolved: a name that merely resolves to loopback does
// not count.
func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '_' {
			return false
		}
	}
	return true
}

// receives reports whether channel c takes the notifications of an approval
// of types.
func (c Channel) receives(types []string) bool {
	if slices.Contains(c.Types, "*") {
		return true
	}
	for _, t := range types {
		if slices.Contains(c.Types, t) {
			return true
		}
	}
	return false
}

// Where describes a channel's destination without its secrets: the URL's
// host, or the mail server.
func (c Channel) Where() string {
	switch c.Kind {
	case KindEmail:
		return c.SMTP.Host
	default:
		if u, err := url.Parse(c.URL.reveal()); err == nil {
			return u.Hostname()
		}
		return ""
	}
}
