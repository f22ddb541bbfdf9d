// connect's errors when there is no NATS server to reach: what is wrong and
// what to do, as the capstan command says it.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import { describe, test } from "node:test";
import { CapstanError, connect } from "../src/index.js";

/** A loopback port nothing listens on (one the system just gave and took back). */
async function closedPort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((resolve) => {
    srv.listen(0, "127.0.0.1", resolve);
  });
  const addr = srv.address();
  assert.ok(addr !== null && typeof addr === "object");
  await new Promise<void>((resolve) => {
    srv.close(() => {
      resolve();
    });
  });
  return addr.port;
}

describe("connect", () => {
  test("with no server listening it says none answers and how to start one", async () => {
    const url = `nats://127.0.0.1:${await closedPort()}`;
    const err = (await connect({ servers: url, timeoutMs: 2000 }).catch((e: unknown) => e)) as CapstanError;
    assert.ok(err instanceof CapstanError, String(err));
    assert.equal(err.code, "TRANSPORT");
    assert.match(err.message, new RegExp(`No NATS server answers at ${url}`));
    assert.match(err.message, /capstan dev/);
  });

  test("a web address (the console's) is refused before any connection, naming the nats:// form", async () => {
    const err = (await connect({ servers: "http://127.0.0.1:8233" }).catch((e: unknown) => e)) as CapstanError;
    assert.ok(err instanceof CapstanError, String(err));
    assert.equal(err.code, "INVALID_ARGUMENT");
    assert.match(err.message, /http:\/\/127\.0\.0\.1:8233 is a web address, not a NATS server's: NATS URLs begin nats:\/\//);
  });
});
