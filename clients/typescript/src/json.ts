// JSON read without losing integers: an approval's input is canonical JSON,
// and an approver must see 12345678901234567890 as it is, not as the nearest
// float64.

/** Parses JSON text; integers beyond 2^53 become bigint, other numbers number. */
export function parseJSON(text: string): unknown {
  let i = 0;
  const fail = (what: string): never => {
    throw new SyntaxError(`JSON: ${what} at offset ${i}`);
  };
  const ws = (): void => {
    while (i < text.length && (text[i] === " " || text[i] === "\t" || text[i] === "\n" || text[i] === "\r")) i++;
  };
  // items reads an object's or an array's comma-separated items, each with
  // item, and the close that ends them.
  const items = (close: string, item: () => void): void => {
    ws();
    if (text[i] === close) {
      i++;
      return;
    }
    for (;;) {
      item();
      ws();
      if (text[i] === ",") {
        i++;
        continue;
      }
      if (text[i] === close) {
        i++;
        return;
      }
      fail(`want ',' or '${close}'`);
    }
  };
  const value = (depth: number): unknown => {
    if (depth > 10000) fail("nesting too deep");
    ws();
    const c = text[i];
    if (c === "{") {
      i++;
      const o: Record<string, unknown> = {};
      items("}", () => {
        ws();
        if (text[i] !== '"') fail("want a key");
        const k = str();
        ws();
        if (text[i] !== ":") fail("want ':'");
        i++;
        const v = value(depth + 1);
        Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
      });
      return o;
    }
    if (c === "[") {
      i++;
      const a: unknown[] = [];
      items("]", () => a.push(value(depth + 1)));
      return a;
    }
    if (c === '"') return str();
    if (text.startsWith("true", i)) {
      i += 4;
      return true;
    }
    if (text.startsWith("false", i)) {
      i += 5;
      return false;
    }
    if (text.startsWith("null", i)) {
      i += 4;
      return null;
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i));
    if (m === null) return fail("want a value");
    i += m[0].length;
    if (m[2] === undefined && m[3] === undefined) {
      const n = BigInt(m[0]);
      return n <= BigInt(Number.MAX_SAFE_INTEGER) && n >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(n) : n;
    }
    return Number(m[0]);
  };
  const str = (): string => {
    const start = i;
    i++;
    for (;;) {
      const c = text[i];
      if (c === undefined) fail("unterminated string");
      if (c === '"') break;
      i += c === "\\" ? 2 : 1;
    }
    i++;
    return JSON.parse(text.slice(start, i)) as string;
  };
  const v = value(0);
  ws();
  if (i !== text.length) fail("more after the value");
  return v;
}

/**
 * A value as JSON: bigint as its digits, Uint8Array as base64 (as Go's
 * encoding/json writes []byte). What a model or a log may be given.
 */
export function toJSONValue(v: unknown): unknown {
  if (typeof v === "bigint") {
    return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v.toString();
  }
  if (v instanceof Uint8Array) return Buffer.from(v).toString("base64");
  if (Array.isArray(v)) return v.map(toJSONValue);
  if (v !== null && typeof v === "object" && !(v instanceof Date)) {
    const o: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) {
      Object.defineProperty(o, k, { value: toJSONValue(x), enumerable: true, writable: true, configurable: true });
    }
    return o;
  }
  return v;
}

/**
 * JSON text of a value, every integer exact (bigint as its digits) and
 * Uint8Array as base64: the JSON form Go prints of the same value.
 */
export function stringifyJSON(v: unknown, indent?: number): string {
  const marks = new Map<string, string>();
  let n = 0;
  const marked = JSON.stringify(
    v,
    function (this: Record<string, unknown>, k: string, x: unknown) {
      const original = this[k]; // before a Buffer's toJSON
      if (original instanceof Uint8Array) return Buffer.from(original).toString("base64");
      if (typeof x === "bigint") {
        const m = `\u0000big${n++}\u0000`;
        marks.set(m, x.toString());
        return m;
      }
      if (x instanceof Uint8Array) return Buffer.from(x).toString("base64");
      return x;
    },
    indent,
  );
  if (marks.size === 0) return marked;
  return marked.replace(/"\\u0000big\d+\\u0000"/g, (m) => marks.get(JSON.parse(m) as string) ?? m);
}
