// Times on the wire are msgpack timestamps, to the nanosecond. The client
// shows them as Go renders them in JSON (RFC 3339 in UTC, nanoseconds with
// their trailing zeros dropped), which keeps every nanosecond and reads back
// into a Date with new Date(text).

/** A point in time as msgpack carries it. */
export interface Timestamp {
  /** Seconds since 1970-01-01T00:00:00Z. */
  seconds: bigint;
  /** 0 to 999,999,999. */
  nanos: number;
}

/** Go's zero time, 0001-01-01T00:00:00Z: a field holding it is absent. */
const zeroSeconds = -62135596800n;

export function isZeroTimestamp(t: Timestamp): boolean {
  return t.seconds === zeroSeconds && t.nanos === 0;
}

/** RFC 3339 in UTC, as Go's time.Time renders itself in JSON. */
export function formatTimestamp(t: Timestamp): string {
  const d = new Date(Number(t.seconds) * 1000);
  const iso = d.toISOString(); // YYYY-MM-DDTHH:MM:SS.000Z (or ±YYYYYY-…)
  const base = iso.slice(0, iso.length - 5);
  if (t.nanos === 0) return base + "Z";
  return base + "." + t.nanos.toString().padStart(9, "0").replace(/0+$/, "") + "Z";
}

const rfc3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?([Zz]|[+-]\d{2}:\d{2})$/;

/** Reads RFC 3339 text (any offset, up to nanoseconds). */
export function parseTimestamp(s: string): Timestamp {
  const m = rfc3339.exec(s);
  if (m === null) throw new RangeError(`${JSON.stringify(s)} is not an RFC 3339 time`);
  const [, y, mo, d, h, mi, sec, frac, zone] = m as unknown as [string, string, string, string, string, string, string, string | undefined, string];
  const date = new Date(0);
  date.setUTCFullYear(Number(y), Number(mo) - 1, Number(d));
  date.setUTCHours(Number(h), Number(mi), Number(sec), 0);
  if (Number.isNaN(date.getTime())) throw new RangeError(`${JSON.stringify(s)} is not an RFC 3339 time`);
  let seconds = BigInt(date.getTime() / 1000);
  if (zone !== "Z" && zone !== "z") {
    const sign = zone.startsWith("-") ? -1n : 1n;
    seconds -= sign * BigInt(Number(zone.slice(1, 3)) * 3600 + Number(zone.slice(4, 6)) * 60);
  }
  const nanos = frac === undefined ? 0 : Number(frac.padEnd(9, "0"));
  return { seconds, nanos };
}

/** The instant of a Date (to the millisecond). */
export function timestampOfDate(d: Date): Timestamp {
  const ms = d.getTime();
  const seconds = Math.floor(ms / 1000);
  return { seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1_000_000 };
}

/** A time given as a Date or RFC 3339 text, as text. */
export function timeText(t: Date | string): string {
  return typeof t === "string" ? formatTimestamp(parseTimestamp(t)) : formatTimestamp(timestampOfDate(t));
}

/** Milliseconds since 1970 of RFC 3339 text. */
export function timeMillis(s: string): number {
  const t = parseTimestamp(s);
  return Number(t.seconds) * 1000 + Math.floor(t.nanos / 1_000_000);
}
