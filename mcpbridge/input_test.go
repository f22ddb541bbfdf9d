package mcpbridge_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/capstan-dev/capstan/envelope"
	"github.com/capstan-dev/capstan/internal/broker"
	"github.com/capstan-dev/capstan/internal/mcptasks"
	"github.com/capstan-dev/capstan/internal/testenv"
	"github.com/capstan-dev/capstan/mcpbridge"
)

// rpcReply is one JSON-RPC response as a client reads it.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// post sends one JSON-RPC body to the bridge's HTTP endpoint as token, in
// session sid (none when empty), and returns the HTTP status, the
// Mcp-Session-Id it answered and the JSON-RPC response, read from a JSON
// body or the first data line of an event stream that carries a message.
func post(t *testing.T, url, token, sid, body string) (int, string, *rpcReply) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var data []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			// A stream may open with an event of no data, which only gives
			// the client an id to resume from.
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "" {
				data = []byte(d)
				break
			}
		}
	} else {
		data, _ = io.ReadAll(resp.Body)
	}
	var r rpcReply
	if len(data) == 0 || json.Unmarshal(data, &r) != nil {
		return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), nil
	}
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), &r
}

// initialized opens a session for token whose client declares the Tasks
// extension, and returns its id.
func initialized(t *testing.T, url, token string) string {
	t.Helper()
	code, sid, r := post(t, url, token, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",`+
		`"capabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}},"clientInfo":{"name":"raw","version":"1"}}}`)
	if code != http.StatusOK || sid == "" || r == nil || r.Error != nil {
		t.Fatalf("initialize: HTTP %d, session %q, reply %+v", code, sid, r)
	}
	t.Cleanup(func() { // end the session, as a client leaving does
		req, err := http.NewRequest(http.MethodDelete, url, nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Session-Id", sid)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	})
	if code, _, _ := post(t, url, token, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); code != http.StatusAccepted {
		t.Fatalf("notifications/initialized: HTTP %d", code)
	}
	return sid
}

// A tasks/* request without params is malformed: it is answered with a
// JSON-RPC error, and the bridge goes on serving.
func TestTasksMethods_WithoutParams_AnswerAnErrorAndTheBridgeServesOn(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	sid := initialized(t, srv.URL, aliceToken)
	for i, body := range []string{
		`{"jsonrpc":"2.0","id":10,"method":"tasks/get"}`,
		`{"jsonrpc":"2.0","id":11,"method":"tasks/cancel","params":null}`,
		`{"jsonrpc":"2.0","id":12,"method":"tasks/update"}`,
	} {
		_, _, r := post(t, srv.URL, aliceToken, sid, body)
		if r == nil || r.Error == nil || (r.Error.Code != -32602 && r.Error.Code != -32600) {
			t.Errorf("request %d %s: reply %+v, want a JSON-RPC error -32602 or -32600", i, body, r)
		}
	}
	_, _, r := post(t, srv.URL, aliceToken, sid, `{"jsonrpc":"2.0","id":20,"method":"tools/list","params":{}}`)
	if r == nil || r.Error != nil || len(r.Result) == 0 {
		t.Errorf("tools/list after malformed tasks requests: %+v", r)
	}
}

// A client that declares the Tasks extension and cancels its tools/call
// before the call answered its task never learns the task id: the
// execution must be cancelled, as for any other call.
func TestTasks_CallCancelledBeforeItsTaskCancelsTheExecution(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{TaskAfter: time.Minute})
	cs := f.connectTasks(t, f.bridge, alice)
	id, err := f.callBlockedThenCancel(t, cs, "t")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("CallTool = %v, want context.Canceled", err)
	}
	actx, acancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer acancel()
	env, err := f.client.Await(actx, id)
	if err != nil {
		st, _ := f.client.Status(testCtx(t), id)
		state := "unknown"
		if st != nil && st.Record != nil {
			state = string(st.Record.State)
		}
		t.Fatalf("the cancelled call's execution %s did not end (%v); it is %s", id, err, state)
	}
	if env.Status != envelope.StatusCancelled {
		t.Errorf("envelope = %s, want cancelled", env.Status)
	}
}

// Without sessions, JSON-RPC ids are unique per client only: two clients
// of one caller (one token) may each have a tools/call 7 in flight. A
// notifications/cancelled for request 7 must reach the call that was
// cancelled; today the second call replaces the first in the bridge's
// table, so the first can no longer be cancelled at all (and the
// cancellation ends the other client's call instead).
func TestHTTPStateless_CancelReachesTheCallEvenWhenAnotherUsesItsID(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTPWith(t, &mcpbridge.HTTPOptions{Stateless: true})
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"test.block","arguments":{"note":"s"}}}`
	var ids []string
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL, strings.NewReader(call))
			if err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}()
		select {
		case id := <-f.started:
			ids = append(ids, id)
		case <-testCtx(t).Done():
			t.Fatal("test.block never started")
		}
	}
	t.Cleanup(func() {
		for _, id := range ids {
			_, _ = f.client.Cancel(context.Background(), id)
		}
		<-done
		<-done
	})
	code, _, _ := post(t, srv.URL, aliceToken, "", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`)
	if code != http.StatusAccepted {
		t.Fatalf("notifications/cancelled: HTTP %d", code)
	}
	actx, acancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer acancel()
	env, err := f.client.Await(actx, ids[0])
	if err != nil {
		other := "unknown"
		if st, serr := f.client.Status(testCtx(t), ids[1]); serr == nil && st.Envelope != nil {
			other = string(st.Envelope.Status)
		} else if serr == nil && st.Record != nil {
			other = string(st.Record.State)
		}
		t.Fatalf("the first call 7 (execution %s) was not cancelled: %v; the second call 7 is %s", ids[0], err, other)
	}
	if env.Status != envelope.StatusCancelled {
		t.Errorf("first call 7 ended %s, want cancelled", env.Status)
	}
}

// On loopback, a request whose Origin is present and not a loopback
// origin (a page of another site, e.g. after DNS rebinding) is answered
// 403, whatever it carries; one whose Host is not loopback too.
func TestHTTP_ForeignOriginOrHostOnLoopbackIs403(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",` +
		`"capabilities":{},"clientInfo":{"name":"page","version":"1"}}}`
	for name, set := range map[string]func(*http.Request){
		"origin": func(r *http.Request) { r.Header.Set("Origin", "http://rebound.example") },
		"host":   func(r *http.Request) { r.Host = "rebound.example" },
	} {
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: HTTP %d (session %q), want 403", name, resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
		}
	}
}

// When capstan cannot answer (here: no worker serves the approvals
// listing), a tool call tells the model so without the bridge's internals:
// no NATS error text, in a result or a JSON-RPC error.
func TestToolsCall_CapstanUnavailable_AnswersNoInternals(t *testing.T) {
	t.Parallel()
	env := testenv.Start(t)
	nc := env.Connect(t)
	if _, err := broker.Provision(testCtx(t), nc, broker.Config{}); err != nil {
		t.Fatal(err)
	}
	b, err := mcpbridge.New(nc, mcpbridge.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	f := &fixture{env: env, nc: nc, bridge: b}
	cs := f.connectMemory(t, alice, newEvents())
	res, err := cs.CallTool(testCtx(t), &mcp.CallToolParams{Name: mcpbridge.ResumeTool,
		Arguments: map[string]any{"approvalId": "01a22f08-fcd5-7df7-9874-25b857043ab3"}})
	answer := ""
	if err != nil {
		answer = err.Error()
	} else {
		answer = textOf(res)
	}
	for _, internal := range []string{"nats", "responders", "list approvals"} {
		if strings.Contains(strings.ToLower(answer), internal) {
			t.Errorf("capstan.resume answered %q: it names the bridge's internals (%q)", answer, internal)
		}
	}
}

// cutter breaks, on demand, the response stream of the first tools/call
// POST that goes through it, as a proxy or a flaky network does.
type cutter struct {
	next http.RoundTripper
	cut  chan struct{}
	once sync.Once
}

func (c *cutter) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := c.next.RoundTrip(r)
	if err != nil || r.Method != http.MethodPost || !bytes.Contains(body, []byte(`"tools/call"`)) {
		return resp, err
	}
	first := false
	c.once.Do(func() { first = true })
	if !first {
		return resp, nil
	}
	pr, pw := io.Pipe()
	src := resp.Body
	go func() {
		<-c.cut
		_ = pw.CloseWithError(io.ErrUnexpectedEOF)
		_ = src.Close()
	}()
	go func() {
		_, err := io.Copy(pw, src)
		_ = pw.CloseWithError(err)
	}()
	resp.Body = pr
	return resp, nil
}

// A tools/call whose response stream breaks while its execution runs still
// gets its result once (the client resumes the stream): otherwise the model
// learns neither the result nor the execution id, and can only call again,
// running the capability a second time.
func TestHTTP_CallWhoseStreamBreaks_GetsItsResult(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTP(t)
	cut := &cutter{next: bearer{token: aliceToken, next: http.DefaultTransport}, cut: make(chan struct{})}
	tr := &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: cut}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "flaky", Version: "v0"}, nil).Connect(testCtx(t), tr, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	ctx, cancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer cancel()
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	ans := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "test.gate", Arguments: map[string]any{"note": "once"}})
		ans <- answer{res, err}
	}()
	id := <-f.started
	close(cut.cut)
	f.gate <- struct{}{}
	if env, err := f.client.Await(testCtx(t), id); err != nil || env.Status != envelope.StatusCompleted {
		t.Fatalf("execution %s: %v %v", id, env, err)
	}
	a := <-ans
	if a.err != nil {
		t.Fatalf("the call whose stream broke answered %v; its execution %s completed, and the model was not told so", a.err, id)
	}
	if textOf(a.res) != `"through once"` {
		t.Errorf("result %s", textOf(a.res))
	}
}

// HTTPOptions.Stateless: "a client that closes [its request] cancels the
// call". A stateless bridge also serves clients of the older protocols
// (no Mcp-Protocol-Version, or 2025-11-25): their closed request must
// cancel the execution too, and not leave the call waiting for
// CallTimeout.
func TestHTTPStateless_OlderProtocolClientClosingItsRequestCancelsTheCall(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTPWith(t, &mcpbridge.HTTPOptions{Stateless: true})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test.block","arguments":{"note":"old"}}}`))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	var id string
	select {
	case id = <-f.started:
	case <-testCtx(t).Done():
		t.Fatal("test.block never started")
	}
	t.Cleanup(func() { _, _ = f.client.Cancel(context.Background(), id) })
	cancel() // the client gives up: its request is closed
	<-done
	actx, acancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer acancel()
	env, err := f.client.Await(actx, id)
	if err != nil {
		t.Fatalf("the call whose client closed its request still runs (execution %s): %v", id, err)
	}
	if env.Status != envelope.StatusCancelled {
		t.Errorf("ended %s, want cancelled", env.Status)
	}
}

// A bridge that began closing cancels nothing when the server ends the
// requests still open: a stateless call's execution goes on (its result
// stays readable), although a client closing its request cancels it.
func TestHTTPStateless_RequestEndedAfterBeginClose_ExecutionGoesOn(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	srv := f.serveHTTPWith(t, &mcpbridge.HTTPOptions{Stateless: true})
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, srv.URL, strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"test.gate","arguments":{"note":"on"},`+
				`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},`+
				`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}}}}`))
		if err != nil {
			return
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "test.gate")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
	}()
	var id string
	select {
	case id = <-f.started:
	case <-testCtx(t).Done():
		t.Fatal("test.gate never started")
	}
	f.bridge.BeginClose()
	srv.CloseClientConnections() // as http.Server.Close does
	<-done
	srv.Close() // returns once every request, and any cancel it made, ended
	actx, acancel := context.WithTimeout(testCtx(t), 15*time.Second)
	defer acancel()
	go func() {
		select {
		case f.gate <- struct{}{}:
		case <-actx.Done():
		}
	}()
	env, err := f.client.Await(actx, id)
	if err != nil {
		t.Fatalf("execution %s: %v", id, err)
	}
	if env.Status != envelope.StatusCompleted {
		t.Errorf("the execution of a call whose request the closing server ended is %s, want completed", env.Status)
	}
}

// A call whose input is larger than the server takes in one message could
// not have been stored: the model is told so (not retryable as it is, and
// nothing ran), not that capstan is unavailable and the call may run under
// an execution id that capstan_status would then show queued forever.
func TestToolsCall_InputTooLargeToPublish_NothingRanNoExecutionID(t *testing.T) {
	t.Parallel()
	f := start(t, mcpbridge.Config{})
	cs := f.connectMemory(t, alice, newEvents())
	ctx := testCtx(t)
	big := strings.Repeat("x", int(f.nc.MaxPayload())+1)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "demo_echo", Arguments: map[string]any{"data": big}})
	if err != nil {
		t.Fatal(err)
	}
	me := structured(t, res)
	if !res.IsError || me["code"] != string(envelope.CodeInputInvalid) || me["retryable"] == true {
		t.Fatalf("an input larger than a message answers %v: %s", me, textOf(res))
	}
	if id, _ := res.Meta["capstan/executionId"].(string); strings.Contains(textOf(res), mcpbridge.StatusTool) || id != "" && res.Meta["capstan/status"] == "unknown" {
		t.Errorf("the model is sent to read an execution that cannot exist: %s %v", textOf(res), res.Meta)
	}

	// As a 2025-11-25 task: invalid params, not "the call may or may not
	// have been taken".
	s := &rawSession{t: t, url: f.serveHTTP(t).URL, token: aliceToken}
	t.Cleanup(s.close)
	var init map[string]any
	s.ok("initialize", map[string]any{"protocolVersion": mcptasks.CoreTasksVersion, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}}, &init)
	s.notify("notifications/initialized")
	_, e := s.call("tools/call", map[string]any{"name": "demo_echo", "arguments": map[string]any{"data": big}, "task": map[string]any{}})
	if e == nil || e.Code != -32602 || !strings.Contains(e.Message, "too large") {
		t.Errorf("an input larger than a message, as a task: %+v, want -32602 saying it is too large", e)
	}
}
