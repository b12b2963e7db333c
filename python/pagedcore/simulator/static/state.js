// EngineState: the engine's blocks, block tables and queues rebuilt from trace records.
// The JavaScript twin of python/pagedcore/simulator/kv_state.py (KVState.apply): records hold
// absolute values (ref counts after the step, tables as [common prefix, ...new blocks]), so
// live, replayed and simulated traces all end in the same state.
'use strict';
window.PC = window.PC || {};

(function (PC) {
  const NO_OWNER = -1;
  const QUEUES = ['waiting', 'running', 'swapped'];
  const MAX_HISTORY = 20000;
  const MAX_FINISHED = 5000;

  class EngineState {
    constructor() { this.reset(null); }

    reset(snap) {
      this.config = snap ? snap.config : null;
      this.ref = snap ? snap.ref.slice() : [];
      this.owner = snap ? snap.owner.slice() : [];
      this.cached = snap ? snap.cached.map(Boolean) : [];
      this.cpuOwner = snap ? snap.cpu_owner.slice() : [];
      this.seqs = new Map();
      if (snap) for (const [k, s] of Object.entries(snap.seqs)) this.seqs.set(+k, copySeq(s));
      this.queues = {};
      for (const q of QUEUES) this.queues[q] = snap ? snap.queues[q].slice() : [];
      this.step = snap ? snap.step : 0;
      this.time = snap ? snap.time : 0;
      this.stats = snap ? Object.assign({}, snap.stats) : {};
      this.history = snap && snap.history ? snap.history.map(fromSummary) : [];
      this.finished = [];
      this.requestNames = new Map();   // seq id -> request id, kept after the seq ends (for the log)
      for (const [sid, s] of this.seqs) this.requestNames.set(sid, s.request_id);
      this.last = null;                // the last record applied (the step log, the grid's highlights)
      this.before = null;              // remember(last): the state it started from (explain.js)
      this.version = (this.version || 0) + 1;
    }

    // Returns false when the record is older than the state (already inside a snapshot).
    apply(rec) {
      if (rec.kind === 'snapshot') { this.reset(rec); return true; }
      if (rec.kind !== 'step' && rec.kind !== 'sync') return false;
      if (rec.kind === 'step' && rec.step <= this.step) return false;
      this.before = this.remember(rec);
      for (const [b, ref, owner, cached] of rec.blocks || []) {
        this.ref[b] = ref; this.owner[b] = owner; this.cached[b] = !!cached;
      }
      for (const [b, owner] of rec.cpu_blocks || []) this.cpuOwner[b] = owner;
      for (const [k, s] of Object.entries(rec.seqs || {})) {
        if (s === null) this.seqs.delete(+k);
        else { this.seqs.set(+k, copySeq(s)); this.requestNames.set(+k, s.request_id); }
      }
      for (const [sid, n, computed, , numTokens, computedAfter] of rec.scheduled || []) {
        const s = this.seqs.get(sid);   // computedAfter: rejected drafts rolled the computed tokens back
        if (s) { s.num_computed_tokens = computedAfter ?? computed + n; s.num_tokens = numTokens; }
      }
      for (const [k, delta] of Object.entries(rec.tables || {})) {
        const s = this.seqs.get(+k);
        if (s) s.block_table = s.block_table.slice(0, delta[0]).concat(delta.slice(1));
      }
      for (const [q, d] of Object.entries(rec.queues || {})) {
        if (d.ids) { this.queues[q] = d.ids.slice(); continue; }
        const removed = new Set(d.remove);
        this.queues[q] = d.front.concat(this.queues[q].filter((x) => !removed.has(x)), d.add);
      }
      if (rec.kv) this.stats = rec.kv;
      if (rec.kind === 'step') {
        this.step = rec.step;
        this.history.push(fromRecord(rec));
        if (this.history.length > MAX_HISTORY) this.history.splice(0, this.history.length - MAX_HISTORY);
      }
      this.time = rec.time;
      for (const f of rec.finished || []) this.finished.push(f);
      if (this.finished.length > MAX_FINISHED) this.finished.splice(0, this.finished.length - MAX_FINISHED);
      this.last = rec;
      this.version++;
      return true;
    }

    // What the step explanation compares against: the sequences the record touches and the waiting
    // queue as they were before it (explain.js); primitive fields only, the record then mutates them.
    remember(rec) {
      const seqs = new Map(), ids = new Set();
      for (const row of rec.scheduled || []) ids.add(row[0]);
      for (const [sid] of rec.preempted || []) ids.add(sid);
      for (const f of rec.finished || []) ids.add(f.seq_id);
      for (const [, sid] of (rec.events && rec.events.freed) || []) ids.add(sid);
      for (const sid of ids) {
        const s = this.seqs.get(sid);
        if (s) seqs.set(sid, { status: s.status, num_tokens: s.num_tokens, num_prompt_tokens: s.num_prompt_tokens,
          num_computed_tokens: s.num_computed_tokens, num_blocks: s.block_table.length, request_id: s.request_id });
      }
      return { seqs, waiting: this.queues.waiting.slice(), running: this.queues.running.slice(),
        swapped: this.queues.swapped.slice(), stats: this.stats };
    }

    blockState(b) {
      if (this.ref[b] === 0) return this.cached[b] ? 'cached' : 'free';
      return this.ref[b] > 1 ? 'shared' : 'allocated';
    }

    // block id -> [[seq id, logical index], ...] over the live sequences' GPU tables
    holders() {
      const map = new Map();
      for (const [sid, s] of this.seqs) {
        if (s.status === 'swapped') continue;
        s.block_table.forEach((b, i) => {
          if (!map.has(b)) map.set(b, []);
          map.get(b).push([sid, i]);
        });
      }
      return map;
    }

    // What must agree between live, replay and the server (KVState.digest in Python).
    digest() {
      const tables = {};
      for (const sid of [...this.seqs.keys()].sort((a, b) => a - b)) tables[String(sid)] = this.seqs.get(sid).block_table;
      return {
        ref: this.ref, cached: this.cached.map(Number), cpu_owner: this.cpuOwner, tables, queues: this.queues,
        owner: this.owner.map((o, b) => (this.ref[b] || this.cached[b] ? o : NO_OWNER)),
      };
    }
  }

  function copySeq(s) { return Object.assign({}, s, { block_table: s.block_table.slice() }); }

  // One timeline row per step; the recorder sends the same numbers as a compact summary.
  function fromRecord(r) {
    let generated = 0;
    for (const row of r.scheduled || []) if (row[4] === row[2] + row[1] + 1) generated++;
    if (r.spec) generated = r.spec.num_generated_tokens;    // drafts kept: up to k + 1 tokens per row
    return { step: r.step, time: r.time, prefill: r.num_prefill_tokens, decode: r.num_decode_tokens,
      seqs: r.num_seqs, kv: r.kv ? r.kv.usage : 0, preempted: (r.preempted || []).length,
      finished: (r.finished || []).length, dt: r.timing ? r.timing.total : null, generated };
  }

  function fromSummary(a) {
    return { step: a[0], time: a[1], prefill: a[2], decode: a[3], seqs: a[4], kv: a[5], preempted: a[6],
      finished: a[7], dt: a[8], generated: a[9] };
  }

  // A colour per request (forks share their parent's): the golden angle spreads neighbours apart.
  const hueCache = new Map();
  function requestHue(requestId) {
    let h = hueCache.get(requestId);
    if (h === undefined) {
      let x = 0;
      const s = String(requestId);
      for (let i = 0; i < s.length; i++) x = (x * 31 + s.charCodeAt(i)) | 0;
      h = Math.abs(x * 137.508) % 360;
      hueCache.set(requestId, h);
    }
    return h;
  }

  function percentile(values, p) {
    if (!values.length) return null;
    const v = values.slice().sort((a, b) => a - b);
    return v[Math.min(v.length - 1, Math.floor((p / 100) * v.length))];
  }

  PC.EngineState = EngineState;
  PC.requestHue = requestHue;
  PC.percentile = percentile;
  PC.QUEUES = QUEUES;
})(window.PC);
