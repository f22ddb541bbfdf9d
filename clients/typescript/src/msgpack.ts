// The msgpack layer under the records of docs/wire.md. Records are written
// field by field as Go's msgenc.Fields writes them (writer below, driven by
// the schemas of wire.ts); the values records carry (an input, an output, an
// error's details) are written by encodeValue, which makes the choices Go's
// codec makes, and read by @msgpack/msgpack.

import { Decoder, DecodeError as MsgpackDecodeError, ExtensionCodec } from "@msgpack/msgpack";
import { formatTimestamp, type Timestamp, timestampOfDate } from "./time.js";

/** Thrown for bytes that are not a valid record: the client error code DECODE. */
export class DecodeError extends Error {
  override name = "DecodeError";
}

const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: false });

/** UTF-8 bytes of s. */
export function utf8Bytes(s: string): Uint8Array {
  return utf8.encode(s);
}

/** Compares two strings by their UTF-8 bytes, as Go's sort.Strings does. */
export function compareUTF8(a: string, b: string): number {
  // Code points compare as their UTF-8 bytes do; UTF-16 code units do not
  // (a code point above U+FFFF has surrogates below U+E000).
  const ia = a[Symbol.iterator]();
  const ib = b[Symbol.iterator]();
  for (;;) {
    const x = ia.next();
    const y = ib.next();
    if (x.done === true) return y.done === true ? 0 : -1;
    if (y.done === true) return 1;
    const cx = x.value.codePointAt(0) ?? 0;
    const cy = y.value.codePointAt(0) ?? 0;
    if (cx !== cy) return cx < cy ? -1 : 1;
  }
}

/** Grows a byte buffer as msgpack is appended to it. */
export class Writer {
  private buf = new Uint8Array(256);
  private view = new DataView(this.buf.buffer);
  pos = 0;

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.pos + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.pos));
    this.buf = next;
    this.view = new DataView(next.buffer);
  }

  bytes(): Uint8Array {
    return this.buf.slice(0, this.pos);
  }

  u8(b: number): void {
    this.room(1);
    this.buf[this.pos++] = b;
  }

  private u16(n: number): void {
    this.room(2);
    this.view.setUint16(this.pos, n);
    this.pos += 2;
  }

  private u32(n: number): void {
    this.room(4);
    this.view.setUint32(this.pos, n);
    this.pos += 4;
  }

  raw(b: Uint8Array): void {
    this.room(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  nil(): void {
    this.u8(0xc0);
  }

  bool(b: boolean): void {
    this.u8(b ? 0xc3 : 0xc2);
  }

  /** A string, in the shortest form for its UTF-8 length. */
  str(s: string): void {
    const b = utf8.encode(s);
    const l = b.length;
    if (l < 32) this.u8(0xa0 | l);
    else if (l < 0x100) {
      this.u8(0xd9);
      this.u8(l);
    } else if (l < 0x10000) {
      this.u8(0xda);
      this.u16(l);
    } else {
      this.u8(0xdb);
      this.u32(l);
    }
    this.raw(b);
  }

  bin(b: Uint8Array): void {
    const l = b.length;
    if (l < 0x100) {
      this.u8(0xc4);
      this.u8(l);
    } else if (l < 0x10000) {
      this.u8(0xc5);
      this.u16(l);
    } else {
      this.u8(0xc6);
      this.u32(l);
    }
    this.raw(b);
  }

  /** An integer in the fewest bytes, as Go's encoder with compact integers. */
  int(n: number | bigint): void {
    if (typeof n === "number" && Number.isSafeInteger(n) && n >= -0x80000000 && n <= 0xffffffff) {
      this.smallInt(n);
      return;
    }
    const v = BigInt(n);
    if (v >= 0n) {
      if (v <= 0x7fn) this.u8(Number(v));
      else if (v <= 0xffn) {
        this.u8(0xcc);
        this.u8(Number(v));
      } else if (v <= 0xffffn) {
        this.u8(0xcd);
        this.u16(Number(v));
      } else if (v <= 0xffffffffn) {
        this.u8(0xce);
        this.u32(Number(v));
      } else if (v <= 0xffffffffffffffffn) {
        this.u8(0xcf);
        this.room(8);
        this.view.setBigUint64(this.pos, v);
        this.pos += 8;
      } else throw new RangeError(`integer ${v} does not fit in 64 bits`);
      return;
    }
    if (v >= -32n) this.u8(Number(v) & 0xff);
    else if (v >= -0x80n) {
      this.u8(0xd0);
      this.u8(Number(v) & 0xff);
    } else if (v >= -0x8000n) {
      this.u8(0xd1);
      this.u16(Number(v) & 0xffff);
    } else if (v >= -0x80000000n) {
      this.u8(0xd2);
      this.room(4);
      this.view.setInt32(this.pos, Number(v));
      this.pos += 4;
    } else if (v >= -0x8000000000000000n) {
      this.u8(0xd3);
      this.room(8);
      this.view.setBigInt64(this.pos, v);
      this.pos += 8;
    } else throw new RangeError(`integer ${v} does not fit in 64 bits`);
  }

  // smallInt writes an integer of 32 bits or fewer without a bigint.
  private smallInt(n: number): void {
    if (n >= 0) {
      if (n <= 0x7f) this.u8(n);
      else if (n <= 0xff) {
        this.u8(0xcc);
        this.u8(n);
      } else if (n <= 0xffff) {
        this.u8(0xcd);
        this.u16(n);
      } else {
        this.u8(0xce);
        this.u32(n);
      }
      return;
    }
    if (n >= -32) this.u8(n & 0xff);
    else if (n >= -0x80) {
      this.u8(0xd0);
      this.u8(n & 0xff);
    } else if (n >= -0x8000) {
      this.u8(0xd1);
      this.u16(n & 0xffff);
    } else {
      this.u8(0xd2);
      this.room(4);
      this.view.setInt32(this.pos, n);
      this.pos += 4;
    }
  }

  float64(n: number): void {
    this.u8(0xcb);
    this.room(8);
    this.view.setFloat64(this.pos, n);
    this.pos += 8;
  }

  /** The msgpack timestamp (extension -1) in 4, 8 or 12 bytes, as Go writes it. */
  time(t: Timestamp): void {
    const { seconds, nanos } = t;
    if (seconds >= 0n && seconds >> 34n === 0n) {
      const data = (BigInt(nanos) << 34n) | seconds;
      if (data >> 32n === 0n) {
        this.u8(0xd6);
        this.u8(0xff);
        this.u32(Number(data));
        return;
      }
      this.u8(0xd7);
      this.u8(0xff);
      this.room(8);
      this.view.setBigUint64(this.pos, data);
      this.pos += 8;
      return;
    }
    this.u8(0xc7);
    this.u8(12);
    this.u8(0xff);
    this.u32(nanos);
    this.room(8);
    this.view.setBigInt64(this.pos, seconds);
    this.pos += 8;
  }

  mapHeader(n: number): void {
    if (n < 16) this.u8(0x80 | n);
    else if (n < 0x10000) {
      this.u8(0xde);
      this.u16(n);
    } else {
      this.u8(0xdf);
      this.u32(n);
    }
  }

  arrayHeader(n: number): void {
    if (n < 16) this.u8(0x90 | n);
    else if (n < 0x10000) {
      this.u8(0xdc);
      this.u16(n);
    } else {
      this.u8(0xdd);
      this.u32(n);
    }
  }
}

/** How deeply arrays and maps may nest in a record, as in Go's decoder. */
export const maxDepth = 10000;

type Head =
  | { kind: "nil" | "bool" | "int" | "float" }
  | { kind: "str" | "bin" | "ext"; n: number }
  | { kind: "array" | "map"; n: number };

/** Reads msgpack values from bytes whose well-formedness was checked. */
export class Reader {
  private readonly view: DataView;
  pos = 0;

  constructor(readonly b: Uint8Array) {
    this.view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  }

  /** The header at pos, and where its body starts; pos is not moved. */
  private head(): { h: Head; body: number } {
    const b = this.b;
    const p = this.pos;
    if (p >= b.length) throw new DecodeError("record is truncated");
    const c = b[p] as number;
    // need checks that the n bytes of a length after the first byte are there.
    const need = (n: number): void => {
      if (p + 1 + n > b.length) throw new DecodeError("record is truncated");
    };
    if (c <= 0x7f || c >= 0xe0) return { h: { kind: "int" }, body: p + 1 };
    if (c >= 0x80 && c <= 0x8f) return { h: { kind: "map", n: c & 0x0f }, body: p + 1 };
    if (c >= 0x90 && c <= 0x9f) return { h: { kind: "array", n: c & 0x0f }, body: p + 1 };
    if (c >= 0xa0 && c <= 0xbf) return { h: { kind: "str", n: c & 0x1f }, body: p + 1 };
    const v = this.view;
    switch (c) {
      case 0xc0:
        return { h: { kind: "nil" }, body: p + 1 };
      case 0xc2:
      case 0xc3:
        return { h: { kind: "bool" }, body: p + 1 };
      case 0xc4:
      case 0xd9:
        need(1);
        return { h: { kind: c === 0xc4 ? "bin" : "str", n: v.getUint8(p + 1) }, body: p + 2 };
      case 0xc5:
      case 0xda:
        need(2);
        return { h: { kind: c === 0xc5 ? "bin" : "str", n: v.getUint16(p + 1) }, body: p + 3 };
      case 0xc6:
      case 0xdb:
        need(4);
        return { h: { kind: c === 0xc6 ? "bin" : "str", n: v.getUint32(p + 1) }, body: p + 5 };
      case 0xc7:
        need(2);
        return { h: { kind: "ext", n: v.getUint8(p + 1) }, body: p + 3 };
      case 0xc8:
        need(3);
        return { h: { kind: "ext", n: v.getUint16(p + 1) }, body: p + 4 };
      case 0xc9:
        need(5);
        return { h: { kind: "ext", n: v.getUint32(p + 1) }, body: p + 6 };
      case 0xca:
        return { h: { kind: "float" }, body: p + 5 };
      case 0xcb:
        return { h: { kind: "float" }, body: p + 9 };
      case 0xcc:
      case 0xd0:
        return { h: { kind: "int" }, body: p + 2 };
      case 0xcd:
      case 0xd1:
        return { h: { kind: "int" }, body: p + 3 };
      case 0xce:
      case 0xd2:
        return { h: { kind: "int" }, body: p + 5 };
      case 0xcf:
      case 0xd3:
        return { h: { kind: "int" }, body: p + 9 };
      case 0xd4:
        return { h: { kind: "ext", n: 1 }, body: p + 2 };
      case 0xd5:
        return { h: { kind: "ext", n: 2 }, body: p + 2 };
      case 0xd6:
        return { h: { kind: "ext", n: 4 }, body: p + 2 };
      case 0xd7:
        return { h: { kind: "ext", n: 8 }, body: p + 2 };
      case 0xd8:
        return { h: { kind: "ext", n: 16 }, body: p + 2 };
      case 0xdc:
        need(2);
        return { h: { kind: "array", n: v.getUint16(p + 1) }, body: p + 3 };
      case 0xdd:
        need(4);
        return { h: { kind: "array", n: v.getUint32(p + 1) }, body: p + 5 };
      case 0xde:
        need(2);
        return { h: { kind: "map", n: v.getUint16(p + 1) }, body: p + 3 };
      case 0xdf:
        need(4);
        return { h: { kind: "map", n: v.getUint32(p + 1) }, body: p + 5 };
    }
    throw new DecodeError(`byte 0x${c.toString(16)} at offset ${p} is not a msgpack value`);
  }

  /**
   * Checks the value at pos without decoding it and moves past it: every
   * length fits in the bytes that remain and nesting stays within maxDepth,
   * as Go's decoder checks before it allocates.
   */
  walk(): void {
    // Iterative: a JavaScript stack is shallower than the 10,000 levels
    // Go's decoder accepts. Each entry is what is left to read of an
    // enclosing array or map.
    const stack: number[] = [];
    let remaining = 1;
    for (;;) {
      if (remaining === 0) {
        const up = stack.pop();
        if (up === undefined) return;
        remaining = up;
        continue;
      }
      remaining--;
      const { h, body } = this.head();
      if (body > this.b.length) throw new DecodeError("record is truncated");
      this.pos = body;
      switch (h.kind) {
        case "str":
        case "bin":
        case "ext": // body starts after the type byte
          this.take(h.n);
          break;
        case "array":
        case "map": {
          if (stack.length >= maxDepth) throw new DecodeError(`values nest deeper than ${maxDepth}`);
          const n = h.kind === "map" ? 2 * h.n : h.n;
          if (n > this.b.length - this.pos) throw new DecodeError("record declares more than it holds");
          stack.push(remaining);
          remaining = n;
          break;
        }
        default:
          break;
      }
    }
  }

  private take(n: number): void {
    if (n > this.b.length - this.pos) throw new DecodeError("record is truncated");
    this.pos += n;
  }

  /** Skips the value at pos and returns its bytes. */
  skip(): Uint8Array {
    const start = this.pos;
    this.walk();
    return this.b.subarray(start, this.pos);
  }

  isNil(): boolean {
    return this.b[this.pos] === 0xc0;
  }

  nil(): void {
    this.pos++;
  }

  /** A map's length; null for nil. */
  mapLen(): number | null {
    const { h, body } = this.head();
    if (h.kind === "nil") {
      this.pos = body;
      return null;
    }
    if (h.kind !== "map") throw new DecodeError(`want a map at offset ${this.pos}`);
    this.pos = body;
    return h.n;
  }

  /** An array's length; null for nil. */
  arrayLen(): number | null {
    const { h, body } = this.head();
    if (h.kind === "nil") {
      this.pos = body;
      return null;
    }
    if (h.kind !== "array") throw new DecodeError(`want an array at offset ${this.pos}`);
    this.pos = body;
    return h.n;
  }

  /** A string (or binary, read as UTF-8, as Go reads one into a string); "" for nil. */
  string(): string {
    const { h, body } = this.head();
    if (h.kind === "nil") {
      this.pos = body;
      return "";
    }
    if (h.kind !== "str" && h.kind !== "bin") throw new DecodeError(`want a string at offset ${this.pos}`);
    this.pos = body + h.n;
    return utf8Decoder.decode(this.b.subarray(body, body + h.n));
  }

  /** Binary (or a string's bytes); empty for nil. */
  binary(): Uint8Array {
    const { h, body } = this.head();
    if (h.kind === "nil") {
      this.pos = body;
      return new Uint8Array(0);
    }
    if (h.kind !== "str" && h.kind !== "bin") throw new DecodeError(`want binary data at offset ${this.pos}`);
    this.pos = body + h.n;
    return this.b.slice(body, body + h.n);
  }

  bool(): boolean {
    const c = this.b[this.pos];
    if (c === 0xc0 || c === 0xc2) {
      this.pos++;
      return false;
    }
    if (c === 0xc3) {
      this.pos++;
      return true;
    }
    throw new DecodeError(`want a boolean at offset ${this.pos}`);
  }

  /** An integer of any width, as a number; 0 for nil. One beyond 2^53 is refused. */
  int(): number {
    const c = this.b[this.pos];
    if (c !== undefined && (c <= 0x7f || c >= 0xe0)) {
      this.pos++;
      return c <= 0x7f ? c : c - 0x100;
    }
    const v = this.bigint();
    if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < BigInt(Number.MIN_SAFE_INTEGER)) {
      throw new DecodeError(`integer ${v} beyond 2^53 in a record field`);
    }
    return Number(v);
  }

  /** A float64 (or a float32, or an integer, as Go reads them into a float64); 0 for nil. */
  float(): number {
    const c = this.b[this.pos];
    const v = new DataView(this.b.buffer, this.b.byteOffset, this.b.byteLength);
    if (c === 0xcb || c === 0xca) {
      const n = c === 0xcb ? 8 : 4;
      if (this.pos + 1 + n > this.b.length) throw new DecodeError("record is truncated");
      const f = c === 0xcb ? v.getFloat64(this.pos + 1) : v.getFloat32(this.pos + 1);
      this.pos += 1 + n;
      return f;
    }
    if (c === 0xc0) {
      this.pos++;
      return 0;
    }
    return this.int();
  }

  bigint(): bigint {
    const p = this.pos;
    const c = this.b[p];
    if (c === undefined) throw new DecodeError("record is truncated");
    const v = this.view;
    const at = (n: number): void => {
      if (p + 1 + n > this.b.length) throw new DecodeError("record is truncated");
      this.pos = p + 1 + n;
    };
    if (c <= 0x7f) {
      this.pos = p + 1;
      return BigInt(c);
    }
    if (c >= 0xe0) {
      this.pos = p + 1;
      return BigInt(c - 0x100);
    }
    switch (c) {
      case 0xc0:
        this.pos = p + 1;
        return 0n;
      case 0xcc:
        at(1);
        return BigInt(v.getUint8(p + 1));
      case 0xcd:
        at(2);
        return BigInt(v.getUint16(p + 1));
      case 0xce:
        at(4);
        return BigInt(v.getUint32(p + 1));
      case 0xcf:
        at(8);
        return v.getBigUint64(p + 1);
      case 0xd0:
        at(1);
        return BigInt(v.getInt8(p + 1));
      case 0xd1:
        at(2);
        return BigInt(v.getInt16(p + 1));
      case 0xd2:
        at(4);
        return BigInt(v.getInt32(p + 1));
      case 0xd3:
        at(8);
        return v.getBigInt64(p + 1);
    }
    throw new DecodeError(`want an integer at offset ${p}`);
  }

  /** A msgpack timestamp; null for nil. */
  time(): Timestamp | null {
    const p = this.pos;
    const c = this.b[p];
    const v = this.view;
    if (c === 0xc0) {
      this.pos = p + 1;
      return null;
    }
    let n: number;
    let data: number;
    if (c === 0xd6) [n, data] = [4, p + 2];
    else if (c === 0xd7) [n, data] = [8, p + 2];
    else if (c === 0xc7 && this.b[p + 1] === 12) [n, data] = [12, p + 3];
    else throw new DecodeError(`want a timestamp at offset ${p}`);
    if (this.b[data - 1] !== 0xff) throw new DecodeError(`want a timestamp (extension -1) at offset ${p}`);
    if (data + n > this.b.length) throw new DecodeError("record is truncated");
    this.pos = data + n;
    if (n === 4) return { seconds: BigInt(v.getUint32(data)), nanos: 0 };
    if (n === 8) {
      const x = v.getBigUint64(data);
      return { seconds: x & 0x3ffffffffn, nanos: Number(x >> 34n) };
    }
    return { seconds: v.getBigInt64(data + 4), nanos: v.getUint32(data) };
  }
}

/** Checks that b holds exactly one well-formed msgpack value. */
export function checkWellFormed(b: Uint8Array): void {
  const r = new Reader(b);
  r.walk();
}

// Values read from records: a timestamp as its RFC 3339 text (as Go renders
// it in JSON, to the nanosecond), integers beyond 2^53 as bigint, binary as
// Uint8Array.
const valueCodec = new ExtensionCodec();
valueCodec.register({
  type: -1,
  encode: () => null,
  decode: (data: Uint8Array): string => {
    const r = new Reader(headerFor(data));
    const t = r.time();
    return t === null ? "" : formatTimestamp(t);
  },
});

// headerFor rebuilds the extension header of a timestamp's data so that
// Reader.time reads it.
function headerFor(data: Uint8Array): Uint8Array {
  const n = data.length;
  const head = n === 4 ? [0xd6, 0xff] : n === 8 ? [0xd7, 0xff] : n === 12 ? [0xc7, 12, 0xff] : null;
  if (head === null) throw new DecodeError(`a timestamp of ${n} bytes`);
  const b = new Uint8Array(head.length + n);
  b.set(head);
  b.set(data, head.length);
  return b;
}

// One decoder for every value: it re-enters itself safely when a decode
// happens inside another (it clones), and builds no state per call.
const valueDecoder = new Decoder({ extensionCodec: valueCodec, useBigInt64: true, mapKeyConverter: mapKey });

function mapKey(key: unknown): string | number {
  let k: string | number;
  if (typeof key === "string" || typeof key === "number") k = key;
  else if (typeof key === "bigint") k = key.toString();
  else if (key instanceof Uint8Array) k = utf8Decoder.decode(key); // binary keys read as strings, as Go reads them
  else throw new DecodeError(`a map key of type ${typeof key}`);
  if (k === "__proto__") throw new DecodeError("a map key __proto__ cannot be held by a JavaScript object");
  return k;
}

/**
 * Decodes one msgpack value carried in a record (an input, an output,
 * details): objects, arrays, strings, numbers (bigint beyond 2^53), booleans,
 * null, Uint8Array for binary, timestamps as RFC 3339 text.
 */
export function decodeValue(b: Uint8Array): unknown {
  if (Buffer.isBuffer(b)) b = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
  checkWellFormed(b);
  try {
    return safeIntegers(valueDecoder.decode(b));
  } catch (err) {
    if (err instanceof DecodeError) throw err;
    if (err instanceof MsgpackDecodeError || err instanceof RangeError || err instanceof Error) {
      throw new DecodeError(err.message, { cause: err });
    }
    throw err;
  }
}

// safeIntegers turns 64-bit integers that a number holds exactly into
// numbers, iteratively (values may nest 10,000 deep).
function safeIntegers(v: unknown): unknown {
  const fix = (x: unknown): unknown =>
    typeof x === "bigint" && x <= BigInt(Number.MAX_SAFE_INTEGER) && x >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(x) : x;
  const todo: unknown[] = [v];
  for (let x = todo.pop(); x !== undefined || todo.length > 0; x = todo.pop()) {
    if (Array.isArray(x)) {
      for (let i = 0; i < x.length; i++) {
        x[i] = fix(x[i]);
        if (typeof x[i] === "object") todo.push(x[i]);
      }
    } else if (x !== null && typeof x === "object" && !(x instanceof Uint8Array)) {
      const o = x as Record<string, unknown>;
      for (const k of Object.keys(o)) {
        o[k] = fix(o[k]);
        if (typeof o[k] === "object") todo.push(o[k]);
      }
    }
  }
  return fix(v);
}

/** A value that cannot be sent: refused before anything is published. */
export class ValueError extends TypeError {
  override name = "ValueError";
}

/**
 * Encodes a value as a record carries it, with the choices Go's codec makes
 * for the same JSON value: integers in the fewest bytes, other numbers as
 * float64, a map's keys sorted by their UTF-8 bytes, Uint8Array as binary, a
 * Date as a timestamp, bigint as an integer. Properties whose value is
 * undefined are left out and undefined in an array is null, as in JSON; an
 * object's toJSON is used as JSON.stringify uses it. NaN, infinities,
 * functions, symbols and integers beyond 64 bits have no such form and are
 * refused (ValueError).
 */
export function encodeValue(v: unknown): Uint8Array {
  const w = new Writer();
  try {
    writeValue(w, v, 0, "");
  } catch (err) {
    // Deeper than this JavaScript stack reaches (some thousands of levels).
    if (err instanceof RangeError && !(err instanceof ValueError)) throw new ValueError(`value: ${err.message}`, { cause: err });
    throw err;
  }
  return w.bytes();
}

export function writeValue(w: Writer, v: unknown, depth: number, path: string): void {
  if (depth > maxDepth) throw new ValueError(`${path || "value"}: nests deeper than ${maxDepth}`);
  switch (typeof v) {
    case "undefined":
      w.nil();
      return;
    case "boolean":
      w.bool(v);
      return;
    case "string":
      w.str(v);
      return;
    case "bigint":
      if (v > 0xffffffffffffffffn || v < -0x8000000000000000n) throw new ValueError(`${path || "value"}: ${v} does not fit in 64 bits`);
      w.int(v);
      return;
    case "number":
      if (!Number.isFinite(v)) throw new ValueError(`${path || "value"}: ${v} has no JSON form`);
      if (Number.isSafeInteger(v)) w.int(v);
      else w.float64(v);
      return;
    case "function":
    case "symbol":
      throw new ValueError(`${path || "value"}: a ${typeof v} has no JSON form`);
  }
  if (v === null) {
    w.nil();
    return;
  }
  if (v instanceof Date) {
    if (Number.isNaN(v.getTime())) throw new ValueError(`${path || "value"}: an invalid Date`);
    w.time(timestampOfDate(v));
    return;
  }
  if (v instanceof Uint8Array) {
    w.bin(v);
    return;
  }
  if (ArrayBuffer.isView(v)) {
    w.bin(new Uint8Array(v.buffer, v.byteOffset, v.byteLength));
    return;
  }
  if (Array.isArray(v)) {
    w.arrayHeader(v.length);
    v.forEach((x: unknown, i) => { writeValue(w, x, depth + 1, `${path}[${i}]`); });
    return;
  }
  const o = v as Record<string, unknown> & { toJSON?: unknown };
  if (typeof o.toJSON === "function") {
    writeValue(w, (o.toJSON as () => unknown).call(o), depth + 1, path);
    return;
  }
  let entries: [string, unknown][];
  if (v instanceof Map) {
    entries = [...(v as Map<unknown, unknown>).entries()].map(([k, x]) => [String(k), x]);
  } else {
    entries = Object.entries(o);
  }
  entries = entries.filter(([, x]) => x !== undefined && typeof x !== "function" && typeof x !== "symbol");
  entries.sort(([a], [b]) => compareUTF8(a, b));
  w.mapHeader(entries.length);
  for (const [k, x] of entries) {
    w.str(k);
    writeValue(w, x, depth + 1, path === "" ? k : `${path}.${k}`);
  }
}
