#!/usr/bin/env node
// A second-language consumer of the Affinity conformance vectors (Node >= 18, standard
// library only). It is written from spec/SPEC.md and spec/vectors/README.md alone -- the
// consumer contract -- to show that the contract is enough for a non-Python
// implementation. It implements verl's legacy rule and PR #7435's margin (SPEC sections
// 6-11, 15), the context band (section 7.5), full_determinism in both hash modes, the three
// tie-breaks, unkeyed requests, the counters and observe_loads; it does not implement the dual-threshold gate, lease
// accounting, event decoding (core_events) or construction-time refusals (strict-config),
// and reports those cases as unsupported, never as passed.
//
//   node consumer.mjs [VECTOR_DIR] [--json]     (default: the directory two levels up)
//
// It checks every file's SHA-256 against MANIFEST.json, every case's _info.sha256 against
// its canonical JSON, replays every supported case step by step (outcomes field for
// field, then the listed checks), asserts that it opened every file the manifest lists,
// and prints the supported / unsupported counts. Exit status 0 iff nothing failed, 1 on a
// failed case or an integrity problem, 2 for bad arguments or a VECTOR_DIR that is not a
// vector directory (one line on stderr, no stack trace).
import { createHash } from "node:crypto";
import { readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const SUPPORTED = new Set(["margin", "context_band", "full_determinism", "hash_stable", "tie_hashed",
  "unkeyed", "counters", "observe_loads"]);
const NO_SERVERS = "No available servers in load balancer";
// Negative control for the test suite: a deliberately wrong keep rule must fail vectors.
const MUTANT = process.env.AFFINITY_CONSUMER_MUTANT ?? "";

// ---------------------------------------------------------------- canonical JSON
// JSON.parse turns 2.0 into 2 and rounds integers beyond 2^53 (request_hash is 64-bit),
// so this parser keeps every number's text: canonical output re-emits it unchanged and
// integer arithmetic uses BigInt.
class Num {
  constructor(text) { this.text = text; }
  big() {
    if (!/^-?\d+(\.0+)?$/.test(this.text)) throw new Error(`not an integer: ${this.text}`);
    return BigInt(this.text.split(".")[0]);
  }
  int() { return Number(this.big()); }
}

function parseJson(text) {
  let i = 0;
  const ws = () => { while (" \t\n\r".includes(text[i]) && i < text.length) i++; };
  const value = () => {
    ws();
    const c = text[i];
    if (c === "{") {
      i++; const obj = {}; ws();
      if (text[i] === "}") { i++; return obj; }
      for (;;) {
        ws(); const key = string(); ws();
        if (text[i++] !== ":") throw new Error(`expected ':' at ${i}`);
        obj[key] = value(); ws();
        const sep = text[i++];
        if (sep === "}") return obj;
        if (sep !== ",") throw new Error(`expected ',' or '}' at ${i}`);
      }
    }
    if (c === "[") {
      i++; const arr = []; ws();
      if (text[i] === "]") { i++; return arr; }
      for (;;) {
        arr.push(value()); ws();
        const sep = text[i++];
        if (sep === "]") return arr;
        if (sep !== ",") throw new Error(`expected ',' or ']' at ${i}`);
      }
    }
    if (c === '"') return string();
    for (const [word, v] of [["true", true], ["false", false], ["null", null]]) {
      if (text.startsWith(word, i)) { i += word.length; return v; }
    }
    const m = /^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    if (!m) throw new Error(`unexpected character at ${i}`);
    i += m[0].length;
    return new Num(m[0]);
  };
  const string = () => {
    if (text[i] !== '"') throw new Error(`expected a string at ${i}`);
    let j = i + 1;
    while (text[j] !== '"') j += text[j] === "\\" ? 2 : 1;
    const s = JSON.parse(text.slice(i, j + 1));
    i = j + 1;
    return s;
  };
  const v = value(); ws();
  if (i !== text.length) throw new Error(`trailing data at ${i}`);
  return v;
}

// Keys sorted by code point, separators without spaces, non-ASCII unescaped (README,
// "Condition: file integrity"; SPEC R-CODEC-1).
function canonical(v) {
  if (v instanceof Num) return v.text;
  if (v === null || typeof v === "boolean") return String(v);
  if (typeof v === "string") return JSON.stringify(v);
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  const keys = Object.keys(v).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
}

// Plain JS values for comparisons: integers as Number (all checked values are small).
function plain(v) {
  if (v instanceof Num) return v.int();
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, plain(x)]));
  return v;
}

const sha256 = (data) => createHash("sha256").update(data).digest("hex");

// ---------------------------------------------------------------- CRC-32 (R-HASH-1)
const CRC_TABLE = Array.from({ length: 256 }, (_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});
function stableHash(text) {
  let crc = 0xffffffff;
  for (const byte of Buffer.from(text, "utf8")) crc = CRC_TABLE[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return BigInt((crc ^ 0xffffffff) >>> 0);
}
const mod = (a, n) => Number(((a % BigInt(n)) + BigInt(n)) % BigInt(n)); // floor modulo

// ---------------------------------------------------------------- the balancer (spec)
class Balancer {
  constructor(config, servers) {
    const get = (k, d) => (config[k] === undefined ? d : plain(config[k]));
    this.margin = get("affinity_break_margin", null);
    // The context band (R-BAND-1): T and cap as BigInt, because c may exceed 2^53.
    const tokens = config.affinity_break_tokens ?? null;
    const cap = config.affinity_break_band_cap ?? null;
    this.tokens = tokens === null ? null : tokens.big();
    this.cap = cap === null ? null : cap.big();
    this.capacity = get("max_cache_size", 10000);
    this.det = get("full_determinism", false);
    this.tieBreak = get("tie_break", "first");
    this.hashMode = get("hash_mode", "caller");
    this.pool = [];           // pool order
    this.count = new Map();   // F: in-flight counts
    this.external = new Map(); // X: observed external load
    this.lru = new Map();     // sticky map, least recent first (Map keeps insertion order)
    this.kept = 0; this.broken = 0;
    for (const s of servers) { this.pool.push(s); this.count.set(s, 0); this.external.set(s, 0); }
  }
  load(s) { return this.count.get(s) + this.external.get(s); }
  minLoad() { return Math.min(...this.pool.map((s) => this.load(s))); }
  ties() { const m = this.minLoad(); return this.pool.filter((s) => this.load(s) === m); }
  pick(rid, draw) { // R-TIE-1..4
    const t = this.ties();
    if (this.tieBreak === "first") return t[0];
    if (this.tieBreak === "hashed" && rid !== null) return t[mod(stableHash(rid), t.length)];
    return t[mod(draw, t.length)];
  }
  band(context) { // R-BAND-1: min(m + floor(c / T), cap); c absent counts as 0
    const m = BigInt(this.margin);
    if (this.tokens === null) return m; // R-BAND-3: without T the context is ignored
    const c = context ?? 0n;
    if (MUTANT === "band_ceil") { const up = m + (c + this.tokens - 1n) / this.tokens; return up < this.cap ? up : this.cap; }
    const widened = m + c / this.tokens; // BigInt division truncates: floor for c >= 0
    if (MUTANT === "band_uncapped") return widened;
    return widened < this.cap ? widened : this.cap; // R-BAND-2
  }
  keep(p, context) { // KEEP(p), SECTION 10; R-BAND-5: full_determinism ignores the band
    if (this.det || this.margin === null) return true;
    const bound = BigInt(this.minLoad()) + this.band(context);
    if (MUTANT === "keep_strict_lt") return BigInt(this.load(p)) < bound;
    return BigInt(this.load(p)) <= bound; // R-KEEP-1: inclusive, loads before the increment
  }
  acquire(rid, draw, hash, context) {
    if (this.det && rid === null)
      return { kind: "rejected", reason: "invalid_for_config", message: "full_determinism needs a request_id" };
    if (this.det && this.hashMode === "caller" && hash === null)
      return { kind: "rejected", reason: "invalid_for_config", message: "full_determinism with hash_mode 'caller' needs request_hash" };
    let cls; let previous = null;
    if (rid === null) cls = "unkeyed";
    else if (!this.lru.has(rid)) cls = "new"; // membership test: no refresh (R-LRU-1)
    else {
      const p = this.lru.get(rid); this.lru.delete(rid); this.lru.set(rid, p); // lookup refreshes
      previous = p;
      if (!this.pool.includes(p)) { this.lru.delete(rid); cls = "reselected"; }
      else if (this.keep(p, context)) cls = "kept";
      else cls = "broken";
    }
    let chosen; let evicted = null;
    if (cls === "kept") { chosen = previous; previous = null; this.kept++; }
    else {
      if (this.pool.length === 0) return { kind: "rejected", reason: "no_servers", message: NO_SERVERS };
      if (cls !== "broken" && this.det) {
        chosen = this.hashMode === "caller" ? this.pool[mod(hash, this.pool.length)]
          : [...this.pool].sort()[mod(stableHash(rid), this.pool.length)];
      } else chosen = this.pick(rid, draw);
      if (cls !== "unkeyed") evicted = this.put(rid, chosen);
      if (cls === "broken") this.broken++;
    }
    this.count.set(chosen, this.count.get(chosen) + 1);
    const out = { kind: "acquired", server_id: chosen, path: cls };
    if (previous !== null) out.previous = previous;
    if (evicted !== null) out.evicted = evicted;
    return out;
  }
  put(rid, s) { // R-LRU-3
    let evicted = null;
    if (this.lru.has(rid)) this.lru.delete(rid);
    else if (this.lru.size >= this.capacity) { evicted = this.lru.keys().next().value; this.lru.delete(evicted); }
    this.lru.set(rid, s);
    return evicted;
  }
  release(s) { // R-RLS-1
    let result = "applied";
    if (!this.pool.includes(s)) result = "unknown_server";
    else if (this.count.get(s) === 0) result = "at_zero";
    else this.count.set(s, this.count.get(s) - 1);
    return { kind: "released", server_id: s, result };
  }
  add(ids) { // R-POOL-1, R-POOL-2, R-OBS-2
    for (const s of ids) { if (!this.pool.includes(s)) this.pool.push(s); this.count.set(s, 0); this.external.set(s, 0); }
    return { kind: "pool_changed", servers: [...this.pool] };
  }
  remove(ids) { // R-POOL-3
    for (const s of ids) { this.count.delete(s); this.external.delete(s); }
    this.pool = this.pool.filter((s) => this.count.has(s));
    return { kind: "pool_changed", servers: [...this.pool] };
  }
  clear() { // R-CLR-1
    const out = { kind: "sticky_cache_cleared", cleared_entries: this.lru.size,
      server_loads: this.pool.map((s) => [s, this.count.get(s)]) };
    this.lru.clear();
    return out;
  }
  observe(pairs) { // R-OBS-1
    const updated = []; const ignored = [];
    for (const [s, n] of pairs) {
      if (!this.pool.includes(s)) { ignored.push(s); continue; }
      this.external.set(s, Math.max(0, n - this.count.get(s))); updated.push(s);
    }
    return { kind: "loads_observed", updated, ignored };
  }
  apply(event) {
    const e = plain(event);
    switch (e.op) {
      case "acquire": return this.acquire(e.request_id ?? null, BigInt(event.tie_draw ? event.tie_draw.text : 0),
        event.request_hash == null ? null : event.request_hash.big(),
        event.context_tokens == null ? null : event.context_tokens.big());
      case "release": return this.release(e.server_id);
      case "add_servers": return this.add(e.server_ids);
      case "remove_servers": return this.remove(e.server_ids);
      case "clear_sticky_cache": return this.clear();
      case "observe_loads": return this.observe(e.observed);
      default: throw new Error(`unknown op ${e.op}`);
    }
  }
  observed() { // the fields of "Condition: checks"
    const external = Object.fromEntries(this.pool.filter((s) => this.external.get(s) > 0).map((s) => [s, this.external.get(s)]));
    const servers = this.pool.map((s) => [s, this.count.get(s)]);
    const status = { // R-STAT-1
      servers: Object.fromEntries(servers), total_inflight: servers.reduce((a, [, n]) => a + n, 0),
      active_servers: this.pool.length, registered_handles: [...this.pool],
      affinity_break_margin: this.margin, affinity_kept: this.kept, affinity_broken: this.broken,
      policy: this.margin === null ? "legacy" : "margin", tie_break: this.tieBreak, hash_mode: this.hashMode,
      full_determinism: this.det, lease_accounting: false, sticky_entries: this.lru.size,
    };
    if (Object.keys(external).length) status.external_loads = external;
    return { servers, lru: [...this.lru.entries()], affinity_kept: this.kept,
      affinity_broken: this.broken, external, status };
  }
}

// ---------------------------------------------------------------- replay
function orderedSame(want, got) { // objects: same keys and values; `servers` in status also same order
  return canonical(want) === canonical(got);
}

function runCase(c) {
  const lb = new Balancer(c.config, plain(c.initial_state).servers.map(([s]) => s));
  for (const [index, step] of c.steps.entries()) {
    const at = `steps[${index}]`;
    if (step.checks) {
      const have = lb.observed();
      for (const [field, want] of Object.entries(plain(step.checks))) {
        if (field === "status") {
          for (const [key, value] of Object.entries(want)) {
            if (!orderedSame(value, have.status[key])) return `${at}.checks.status.${key}: want ${canonical(value)}, got ${canonical(have.status[key] ?? null)}`;
            if (key === "servers" && Object.keys(value).join() !== Object.keys(have.status.servers).join()) return `${at}: status.servers pool order`;
          }
        } else if (!orderedSame(want, have[field])) {
          return `${at}.checks.${field}: want ${canonical(want)}, got ${canonical(have[field])}`;
        }
      }
      continue;
    }
    const outcome = lb.apply(step.event);
    if (step.allowed && outcome.kind === "acquired" && !plain(step.allowed).includes(outcome.server_id))
      return `${at}: chose ${outcome.server_id}, not in allowed ${canonical(step.allowed)}`;
    if (!orderedSame(plain(step.expect), outcome))
      return `${at} ${canonical(step.event)}: want ${canonical(step.expect)}, got ${canonical(outcome)}`;
  }
  return null;
}

class UsageError extends Error {}

function readManifest(root) {
  let text;
  try { text = readFileSync(join(root, "MANIFEST.json"), "utf8"); } catch (err) {
    const why = err.code === "ENOENT" ? (statSync(root, { throwIfNoEntry: false }) ? "has no MANIFEST.json" : "does not exist")
      : err.code === "ENOTDIR" ? "is not a directory" : `cannot be read (${err.code ?? err.message})`;
    throw new UsageError(`${root} ${why}: expected a vector directory (MANIFEST.json and <suite>/<case>.json, e.g. spec/vectors)`);
  }
  let manifest;
  try { manifest = parseJson(text); } catch (err) { throw new UsageError(`${join(root, "MANIFEST.json")}: not valid JSON: ${err.message}`); }
  if (manifest === null || typeof manifest.files !== "object" || manifest.files === null || Array.isArray(manifest.files))
    throw new UsageError(`${join(root, "MANIFEST.json")}: expected an object with "files" ({"<suite>/<case>.json": sha256, ...})`);
  return manifest;
}

function main(argv) {
  const unknown = argv.filter((a) => a.startsWith("--") && a !== "--json");
  if (unknown.length) throw new UsageError(`unknown option ${unknown[0]}; accepted: [VECTOR_DIR] [--json]`);
  const dirs = argv.filter((a) => !a.startsWith("--"));
  if (dirs.length > 1) throw new UsageError(`one VECTOR_DIR expected, got ${dirs.length}: ${dirs.join(" ")}`);
  const json = argv.includes("--json");
  const here = dirname(fileURLToPath(import.meta.url));
  const root = resolve(dirs[0] ?? join(here, "..", ".."));
  const manifest = readManifest(root);
  const listed = Object.keys(manifest.files);
  const onDisk = readdirSync(root).filter((d) => d !== "schema" && d !== "consumers" && statSync(join(root, d)).isDirectory())
    .flatMap((d) => readdirSync(join(root, d)).filter((f) => f.endsWith(".json")).map((f) => `${d}/${f}`));
  const result = { passed: 0, failed: 0, unsupported: 0, integrity_errors: 0, opened: 0, listed: listed.length,
    suites: {}, failures: [], unsupported_because: {} };
  const problems = [];
  for (const rel of onDisk.filter((r) => !(r in manifest.files))) problems.push(`${rel}: not in MANIFEST.json`);
  for (const rel of listed) {
    let bytes;
    try { bytes = readFileSync(join(root, rel)); } catch { problems.push(`${rel}: listed but missing`); continue; }
    result.opened++;
    if (sha256(bytes) !== manifest.files[rel]) { problems.push(`${rel}: sha256 differs from MANIFEST.json`); continue; }
    const doc = parseJson(bytes.toString("utf8"));
    const body = Object.fromEntries(Object.entries(doc).filter(([k]) => k !== "_info"));
    if (sha256(canonical(body)) !== doc._info.sha256) { problems.push(`${rel}: _info.sha256 differs from the canonical JSON`); continue; }
    if (`${canonical(doc)}\n` !== bytes.toString("utf8")) { problems.push(`${rel}: not canonical JSON + newline`); continue; }
    const suite = (result.suites[doc.suite] ??= { passed: 0, failed: 0, unsupported: 0 });
    const lacking = doc.features.filter((f) => !SUPPORTED.has(f));
    const why = doc.valid === false ? "construction refusal (strict-config)" : lacking.length ? lacking.join("+") : null;
    if (why) {
      result.unsupported++; suite.unsupported++;
      result.unsupported_because[why] = (result.unsupported_because[why] ?? 0) + 1;
      continue;
    }
    let failure;
    try { failure = runCase(doc); } catch (err) { failure = `crashed: ${err.message}`; }
    if (failure) { result.failed++; suite.failed++; result.failures.push(`${rel}: ${failure}`); }
    else { result.passed++; suite.passed++; }
  }
  if (result.opened !== listed.length) problems.push(`opened ${result.opened} of ${listed.length} files the manifest lists`);
  result.integrity_errors = problems.length;
  result.problems = problems;
  const ok = result.failed === 0 && problems.length === 0;
  if (json) console.log(JSON.stringify(result, null, 2));
  else {
    console.log(`affinity vectors, Node ${process.version} consumer: ${root}`);
    console.log(`  manifest: ${listed.length} files, all opened and digest-checked: ${problems.length === 0 ? "yes" : "NO"}`);
    for (const [name, s] of Object.entries(result.suites).sort())
      console.log(`  ${name.padEnd(16)} ${String(s.passed).padStart(3)} passed ${String(s.failed).padStart(3)} failed ${String(s.unsupported).padStart(3)} unsupported`);
    for (const [why, n] of Object.entries(result.unsupported_because).sort()) console.log(`  unsupported: ${n} need ${why}`);
    for (const line of [...problems, ...result.failures].slice(0, 20)) console.log(`  FAIL ${line}`);
    console.log(`supported ${result.passed + result.failed} (passed ${result.passed}, failed ${result.failed}), unsupported ${result.unsupported}, of ${listed.length}: ${ok ? "pass" : "FAIL"}`);
  }
  return ok ? 0 : 1;
}

try {
  process.exitCode = main(process.argv.slice(2));
} catch (err) {
  if (!(err instanceof UsageError)) throw err;
  console.error(`consumer.mjs: ${err.message}`);
  process.exitCode = 2;
}
