package notifier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/capstan-dev/capstan/notify"
)

// sender delivers one notification to one channel, once: the notifier
// retries.
type sender interface {
	send(ctx context.Context, n *notification) error
}

// failure is a delivery that did not happen, saying whether a retry may
// mend it and how long the receiver asked to be left alone.
type failure struct {
	err        error
	permanent  bool
	retryAfter time.Duration
}

func (f *failure) Error() string { return f.err.Error() }
func (f *failure) Unwrap() error { return f.err }

func transient(format string, a ...any) error { return &failure{err: fmt.Errorf(format, a...)} }
func permanent(format string, a ...any) error {
	return &failure{err: fmt.Errorf(format, a...), permanent: true}
}

func isPermanent(err error) bool {
	var f *failure
	return errors.As(err, &f) && f.permanent
}

func retryAfterOf(err error) time.Duration {
	var f *failure
	if errors.As(err, &f) {
		return f.retryAfter
	}
	return 0
}

// userAgent is the User-Agent of every HTTP delivery.
const userAgent = "capstan-notify/1"

// httpSender posts to a webhook or a Slack incoming webhook.
type httpSender struct {
	ch     Channel
	client *http.Client
	now    func() time.Time
}

func newHTTPSender(ch Channel, now func() time.Time) *httpSender {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	return &httpSender{ch: ch, now: now, client: &http.Client{
		Transport: tr,
		// A redirect would carry the body, and the signature, elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (s *httpSender) send(ctx context.Context, n *notification) error {
	var body []byte
	var err error
	if s.ch.Kind == KindSlack {
		body, err = json.Marshal(slackMessage(n))
	} else {
		body, err = json.Marshal(n.payload())
	}
	if err != nil {
		return permanent("encode the message: %v", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.ch.URL.reveal(), bytes.NewReader(body))
	if err != nil {
		return permanent("the channel's url does not make a request")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(notify.IdempotencyHeader, n.key)
	req.Header.Set("Capstan-Event", string(n.event))
	if s.ch.Kind == KindWebhook {
		req.Header.Set(notify.SignatureHeader, notify.Sign([]byte(s.ch.Secret.reveal()), body, s.now()))
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// url.Error quotes the URL, whose path may be the secret: keep only
		// the host and the cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return transient("POST to %s: %v", s.ch.Where(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusTooManyRequests || code == http.StatusRequestTimeout || code >= 500:
		f := &failure{err: fmt.Errorf("POST to %s: answered %s", s.ch.Where(), resp.Status)}
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			f.retryAfter = time.Duration(secs) * time.Second
		}
		return f
	case code >= 300 && code < 400:
		return permanent("POST to %s: answered %s, a redirect, which is not followed", s.ch.Where(), resp.Status)
	}
	return permanent("POST to %s: answered %s", s.ch.Where(), resp.Status)
}
