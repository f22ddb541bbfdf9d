// Names of capstan's subjects and buckets, from one prefix (docs/wire.md,
// "Subjects"); the Go side is broker.Names.

/** The principal of every subject on a server without authentication. */
export const anonymous = "_anon";

/** Whether p can be a principal: one subject token, [a-z][a-z0-9_-]*, at most 64 bytes, or _anon. */
export function validPrincipal(p: string): boolean {
  return p === anonymous || /^[a-z][a-z0-9_-]{0,63}$/.test(p);
}

export class Names {
  /** Upper-case, for streams and buckets (CAPSTAN). */
  readonly prefix: string;
  /** Lower-case, for subjects (capstan). */
  readonly subject: string;

  constructor(prefix = "CAPSTAN") {
    this.prefix = (prefix === "" ? "CAPSTAN" : prefix).toUpperCase();
    this.subject = this.prefix.toLowerCase();
  }

  get envelopesBucket(): string {
    return `${this.prefix}_ENVELOPES`;
  }

  get executionsBucket(): string {
    return `${this.prefix}_EXECUTIONS`;
  }

  get catalogBucket(): string {
    return `${this.prefix}_CATALOG`;
  }

  /** Where principal publishes requests for capabilityId. */
  exec(principal: string, capabilityId: string): string {
    return `${this.subject}.exec.${principal}.${capabilityId}`;
  }

  /** Where principal publishes requests the catalog does not list, and resumes naming only their approval. */
  unrouted(principal: string): string {
    return this.exec(principal, "_unrouted");
  }

  cancel(principal: string, executionId: string): string {
    return `${this.subject}.cancel.${principal}.${executionId}`;
  }

  describe(principal: string): string {
    return `${this.subject}.describe.${principal}`;
  }

  decide(principal: string): string {
    return `${this.subject}.approvals.decide.${principal}`;
  }

  listApprovals(principal: string): string {
    return `${this.subject}.approvals.list.${principal}`;
  }

  /** Where principal asks the workers for one execution it may see. */
  execution(principal: string): string {
    return `${this.subject}.executions.get.${principal}`;
  }

  /** The envelopes of principal's executions, as the server republishes them. */
  envelopes(principal: string): string {
    return `${this.subject}.envelope.${principal}.>`;
  }

  /** Where workers publish the progress of principal's execution (core NATS, coalesced). */
  progress(principal: string, executionId: string): string {
    return `${this.subject}.progress.${principal}.${executionId}`;
  }

  /** The bucket key a republished envelope's subject names. */
  envelopeKeyOf(subject: string): string {
    return subject.startsWith(`${this.subject}.envelope.`) ? subject.slice(this.subject.length + 10) : "";
  }

  /** principal's reply-subject prefix: the only one the server lets it receive replies on. */
  inboxPrefix(principal: string): string {
    return `_INBOX_${this.subject}.${principal}`;
  }

  /** The principal a connection's inbox prefix names, or _anon. */
  principalOfInbox(inboxPrefix: string | undefined): string {
    const p = `_INBOX_${this.subject}.`;
    if (inboxPrefix?.startsWith(p) === true) {
      const principal = inboxPrefix.slice(p.length);
      if (validPrincipal(principal)) return principal;
    }
    return anonymous;
  }

  /** The direct-get subject of a bucket's key. */
  directGet(bucket: string, key: string): string {
    return `$JS.API.DIRECT.GET.KV_${bucket}.$KV.${bucket}.${key}`;
  }
}

/** The key of principal's execution in the executions and envelopes buckets, and its Nats-Msg-Id. */
export function key(principal: string, executionId: string): string {
  return `${principal}.${executionId}`;
}
