package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
)

var pageNames = []string{"signin", "home", "approvals", "approval", "executions", "execution", "capabilities", "error"}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(assets, "assets/templates/layout.html", "assets/templates/parts.html", "assets/templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("capstan: console template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

var funcs = template.FuncMap{
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
	"iso": func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	},
	"ago":  func(t time.Time) string { return ago(time.Since(t)) },
	"ms":   func(d time.Duration) string { return fmt.Sprintf("+%d ms", d.Milliseconds()) },
	"join": strings.Join,
	// left is a countdown as the page's script writes it, so that the first
	// tick changes nothing but the digits.
	"left": func(t time.Time) string {
		d := time.Until(t)
		if d <= 0 {
			return "expired"
		}
		s := int(d.Seconds())
		if h := s / 3600; h > 0 {
			return fmt.Sprintf("in %d:%02d:%02d", h, s%3600/60, s%60)
		}
		return fmt.Sprintf("in %d:%02d", s/60, s%60)
	},
	"mins": func(d time.Duration) string { return fmt.Sprintf("%d min", int(d.Minutes())) },
	// pass passes the page along with one value to a shared template.
	"pass": func(root page, v any) struct {
		Root page
		V    any
	} {
		return struct {
			Root page
			V    any
		}{root, v}
	},
	"short": func(id string) string { return shortID(id) },
	"json": func(v any) string {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Sprintf("(%v)", err)
		}
		return escapeFormatChars(string(b))
	},
	"visible": visible,
}

// formatChar reports whether r is one of the invisible characters that change
// how the text around them displays: Unicode's format characters (category
// Cf: the bidirectional overrides, embeddings and isolates, zero-width
// joiners...) and the line and paragraph separators. A right-to-left override
// in a value a model wrote shows what follows it reversed, so an approver
// would read another order id or amount than the one approved.
func formatChar(r rune) bool {
	return r == '\u2028' || r == '\u2029' || unicode.Is(unicode.Cf, r)
}

// escapeFormatChars writes the format characters of JSON text as \uXXXX
// escapes: the JSON means the same value, and shows what it holds.
func escapeFormatChars(s string) string {
	if !strings.ContainsFunc(s, formatChar) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if !formatChar(r) {
			b.WriteRune(r)
			continue
		}
		if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, "\\u%04x\\u%04x", r1, r2)
		} else {
			fmt.Fprintf(&b, "\\u%04x", r)
		}
	}
	return b.String()
}

// visible shows a client-written value (a reason, an actor, a comment) with
// its format characters named, as <U+202E>, instead of acting on the text.
func visible(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case fmt.Stringer:
		s = v.String()
	default:
		s = fmt.Sprint(v)
	}
	if !strings.ContainsFunc(s, formatChar) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if formatChar(r) {
			fmt.Fprintf(&b, "<%U>", r)
		} else {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// shortID is an id's first 13 characters (of a UUIDv7: its time to the
// millisecond and a little more), which the CLI takes for the whole id.
// Pages show ids whole; short ones only name them in titles and messages.
func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func ago(d time.Duration) string {
	switch {
	case d < time.Second:
		return "now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// page is what the layout needs besides the page's own data.
type page struct {
	Title  string
	Nav    string
	P      *Principal // nil before sign-in
	CSRF   string
	Flash  *flash
	Open   bool
	Data   any
	Wanted string // the part asked for, when only a part is rendered
}

// render writes a page, or with ?part=NAME only the template NAME of it,
// which the page's script fetches to update itself in place.
func (c *Console) render(w http.ResponseWriter, r *http.Request, s *session, name string, data any) {
	c.renderStatus(w, r, s, http.StatusOK, name, data)
}

func (c *Console) renderStatus(w http.ResponseWriter, r *http.Request, s *session, status int, name string, data any) {
	t := c.pages[name]
	p := page{Title: name, Nav: name, Open: c.cfg.Open, Data: data}
	if s != nil {
		p.P, p.CSRF = &s.p, s.csrf
	}
	tmpl := "layout"
	if part := r.URL.Query().Get("part"); part != "" && t.Lookup("part-"+part) != nil {
		tmpl = "part-" + part
	} else if s != nil {
		p.Flash = s.takeFlash()
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, tmpl, p); err != nil {
		c.log.Error("console render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, s *session, status int, format string, args ...any) {
	c.renderStatus(w, r, s, status, "error", map[string]any{"Status": status, "Message": fmt.Sprintf(format, args...)})
}

// notPermitted says that the principal's role may not read what the page
// shows, and why the client could not open.
func (c *Console) notPermitted(w http.ResponseWriter, r *http.Request, s *session, what string) {
	c.fail(w, r, s, http.StatusForbidden, "Your principal (%s) may not read %s: %v", s.p.Name, what, s.clientErr)
}
