// explain(state): the last record in plain words for someone learning how the scheduler and the
// paged KV cache work: who was scheduled and why (running first, then swapped, then waiting; the
// token budget, the chunk, the sequence cap), who was preempted and why, what the prefix cache saved,
// what was freed, evicted, copied, swapped, and the features that ride on a step when the trace
// carries them (drafted/accepted tokens, forks that share blocks, adapters).
// Returns [[cls, text], ...]; cls picks the colour (pre: trouble, hit: the cache, fin: done).
// The scheduler's rules quoted here are cpp/core/scheduler.cc's.
'use strict';

(function (PC) {
  const MAX_LINES = 40;

  function explain(state) {
    const r = state.last, cfg = state.config || {}, before = state.before || { seqs: new Map(), waiting: [] };
    if (!r) return [['', 'No step yet. Send a request (left) and watch it go through the queues and the blocks.']];
    const out = [];
    const say = (cls, text) => out.push([cls, text]);
    const name = (sid) => {
      const s = state.seqs.get(sid) || before.seqs.get(sid);
      const req = (s && s.request_id) ?? state.requestNames.get(sid);
      return req !== undefined && String(req) !== String(sid) ? `seq ${sid} (${req})` : `seq ${sid}`;
    };
    const plural = (k, one, many) => `${k.toLocaleString('en-US')} ${k === 1 ? one : many || one + 's'}`;
    const bs = cfg.block_size || 16, budget = cfg.max_num_batched_tokens, maxSeqs = cfg.max_num_seqs;
    const ev = r.events || {};

    if (r.kind !== 'step') {
      say('', 'Between steps: requests ended outside a step (an abort, a client that went away). Their blocks go back to the pool now.');
      freed(r, ev, state, say, name, plural);
      return out;
    }

    // -- the batch and its budget -------------------------------------------------------------------------
    const used = r.num_tokens;
    say('head', `Step ${r.step}: ${plural(r.num_seqs, 'sequence')} computed ${plural(used, 'token')}` +
      (budget ? ` — ${pct(used, budget)} of the token budget (max_num_batched_tokens ${budget})` : '') +
      (maxSeqs ? `, ${r.num_seqs} of max_num_seqs ${maxSeqs}` : '') +
      (r.timing && r.timing.total ? `, in ${(r.timing.total * 1000).toFixed(1)} ms` : '') + '.');
    if (!r.num_seqs) say('', 'Nothing could run: every sequence is waiting for blocks or budget.');

    // -- who waits, and why -------------------------------------------------------------------------------
    const waiting = state.queues.waiting || [];
    if (waiting.length) {
      const head = state.seqs.get(waiting[0]);
      let why;
      if ((r.preempted || []).length) why = 'a step that preempts admits nothing new';
      else if ((state.queues.swapped || []).length) why = 'swapped sequences must come back first';
      else if (budget && used >= budget) why = 'the token budget is spent';
      else if (maxSeqs && (state.queues.running || []).length >= maxSeqs) why = `max_num_seqs (${maxSeqs}) sequences are running`;
      else if (head && cfg.enable_chunked_prefill === false && head.num_tokens > budget - used) {
        why = `its prompt (${head.num_tokens} tokens) does not fit the ${budget - used} tokens left, and chunked prefill is off`;
      } else if (head) {
        const need = Math.ceil(head.num_tokens / bs), free = (state.stats || {}).num_free_blocks;
        why = `it needs about ${plural(need, 'block')} for its ${head.num_tokens} tokens` +
          (free !== undefined ? ` and the pool has ${plural(free, 'free block')}` : '') + ' (the head of the queue is not skipped: FCFS stays fair)';
      }
      if (why) say('', `Waiting: ${plural(waiting.length, 'request')} (${cfg.policy === 'priority' ? 'priority' : 'arrival'} order); ` +
        `the head, ${name(waiting[0])}, was not admitted: ${why}.`);
    }


    const rows = r.scheduled || [];
    const decodes = rows.filter((x) => x[3] === 1);
    const hitsBySeq = groupBy(ev.prefix_hits || [], (x) => x[1]);
    const swappedIn = groupBy(ev.swapped_in || [], (x) => x[2]);
    if (decodes.length) {
      say('', `Decode: ${plural(decodes.length, 'running sequence')} ${decodes.length === 1 ? '' : 'each '}computed 1 token ` +
        '(its last sampled one) and sampled the next. The running queue is served first, in order, one token each.');
    }
    let left = budget || Infinity, detailed = 0, hidden = 0;
    if (hitsBySeq.size) {
      const blocks = [...hitsBySeq.values()].reduce((a, x) => a + x.length, 0);
      say('hit', `Prefix cache: ${plural(hitsBySeq.size, 'sequence')} found ${plural(blocks, 'block')} of their prompts ` +
        `already computed: ${plural(blocks * bs, 'token')} of prefill saved this step.`);
    }
    for (const [sid, n, c, kind] of rows) {
      const wasDetailed = detailed;
      const cut = kind === 0 && (state.seqs.get(sid) || before.seqs.get(sid) || { num_prompt_tokens: 0 }).num_prompt_tokens > c + n;
      // The first few chunks in full, and every chunk the budget cut (chunked prefill); the log lists all.
      if (kind !== 1 && ++detailed > 6 && !cut) { left -= n; hidden++; continue; }
      const was = before.seqs.get(sid), s = state.seqs.get(sid) || was;
      const total = s ? (kind === 0 ? s.num_prompt_tokens : Math.max(s.num_tokens - 1, c + n)) : c + n;
      const admitted = !was || was.status === 'waiting';     // unknown before: it arrived during this step
      if (kind !== 1) {
        const what = kind === 0 ? 'prefill' : kind === 2 ? 'recompute (its KV was dropped by a preemption)' : 'verify';
        let why = '';
        const rest = (s ? s.num_prompt_tokens : c + n) - (c + n);
        if (kind === 3) {
          const k = ((r.spec && r.spec.seqs) || []).find((x) => x[0] === sid);
          why = k ? `: its last token and ${plural(k[1], 'draft token')} in one forward; ${plural(k[2], 'draft')} accepted`
            : ': its last token and its draft tokens in one forward';
        } else if (rest > 0) {
          why = n === left ? `: a chunk — the step's budget had only ${left} tokens left (chunked prefill); ` +
            `${plural(rest, 'token')} remain for the next steps` : `: a chunk; ${plural(rest, 'token')} remain`;
        } else if (c > 0 && kind === 0 && !hitsBySeq.has(sid)) {
          why = ': the last chunk of its prompt';
        } else why = c === 0 || hitsBySeq.has(sid) ? ': its whole prompt fits in what is left of the budget'
          : ': the rest fits in the budget';
        say('', `${admitted ? 'Admitted from waiting' : swappedIn.has(sid) ? 'Swapped back in' : 'Running'}: ${name(sid)} — ` +
          `${what} of tokens [${c}, ${c + n})${total > c + n || kind === 0 ? ` of ${total}` : ''}${why}.`);
      }
      left -= n;
      const hits = kind === 1 || wasDetailed < 6 ? hitsBySeq.get(sid) : null;
      if (hits) {
        const shared = Math.max(...hits.map((x) => x[2]));
        say('hit', `Prefix cache: ${name(sid)} found ${plural(hits.length, 'block')} of its prompt already computed ` +
          `(${hits.slice(0, 8).map((x) => 'B' + x[0]).join(' ')}${hits.length > 8 ? ' …' : ''}): ${hits.length * bs} tokens of ` +
          `prefill saved; ${shared > 1 ? `now shared by ${shared} sequences (ref_count ${shared})` : 'revived from the free list'}.`);
      }
      const si = swappedIn.get(sid);
      if (si) say('', `Swap in: ${name(sid)}'s ${plural(si.length, 'block')} copied back from CPU to GPU memory ` +
        '(swapped sequences return before any new request is admitted).');
    }

    if (hidden) say('', `… ${plural(hidden, 'more chunk')} in the Events panel.`);

    // -- preemption -------------------------------------------------------------------------------------
    const preempted = r.preempted || [];
    for (const [sid, mode] of preempted) {
      const was = before.seqs.get(sid);
      const lost = was ? was.num_computed_tokens : 0;
      say('pre', `Preempted: ${name(sid)} by ${mode}. A running sequence needed a new block and the pool had no free ` +
        'block left, so the scheduler took the last running sequence (lowest priority, latest arrival) and ' +
        (mode === 'swap' ? `moved its ${was ? plural(was.num_blocks, 'block') : 'blocks'} to CPU memory; it resumes where it was once blocks free up.`
          : `dropped its KV${lost ? ` (${plural(lost, 'computed token')})` : ''}: it goes back to the front of waiting and recomputes later.`));
    }
    const swapOut = ev.swapped_out || [];
    if (swapOut.length && !preempted.length) say('pre', `Swap out: ${plural(swapOut.length, 'block')} copied to CPU memory.`);

    const swapped = state.queues.swapped || [];
    if (swapped.length && !(ev.swapped_in || []).length) {
      const s = state.seqs.get(swapped[0]);
      say('', `Swapped: ${plural(swapped.length, 'sequence')} wait in CPU memory; the first, ${name(swapped[0])}, comes back ` +
        `when the pool can take its ${s ? plural(s.block_table.length, 'block') : 'blocks'} again (and no step preempts).`);
    }

    // -- the features that ride on a step, when present -------------------------------------------------
    if (r.spec && r.spec.num_draft_tokens) {
      const sp = r.spec;
      say('hit', `Speculative decoding: ${plural(sp.num_draft_tokens, 'draft token')} verified, ${sp.num_accepted_tokens} accepted ` +
        `(${pct(sp.num_accepted_tokens, sp.num_draft_tokens)}); ${plural(sp.num_generated_tokens, 'token')} generated in one ` +
        'forward. The KV slots of rejected drafts are rolled back.');
    }
    for (const [child, parent] of ev.forks || []) {
      const s = state.seqs.get(child);
      say('hit', `Fork: ${name(child)} branched from ${name(parent)} (n > 1 or a beam): it shares all ` +
        `${s ? plural(s.block_table.length, 'block') : 'its parent\'s blocks'} (ref_count +1), nothing copied.`);
    }
    for (const [src, dst, sid] of ev.cow || []) {
      say('', `Copy-on-write: ${name(sid)} is about to write into B${src}, which other sequences share: it gets its own ` +
        `copy B${dst} first; the shared prefix stays shared.`);
    }
    const adapters = countBy(rows.map((x) => state.seqs.get(x[0])).filter(Boolean), (s) => s.lora_name);
    if (adapters.size && !(adapters.size === 1 && adapters.has(undefined))) {
      say('', 'Adapters (LoRA) in this batch: ' + [...adapters].map(([a, k]) => `${a ?? 'base model'} ×${k}`).join(', ') + '.');
    }

    // -- what ended, what the pool got back ---------------------------------------------------------------
    for (const f of (r.finished || []).slice(0, 12)) {
      say('fin', `Finished: ${name(f.seq_id)} (${f.reason}) after ${plural(f.num_output_tokens, 'output token')}` +
        (f.ttft !== null && f.ttft !== undefined ? `; time to first token ${ms(f.ttft)}` : '') +
        (f.tpot !== null && f.tpot !== undefined ? `, ${ms(f.tpot)} per output token` : '') +
        (f.num_cached_tokens > 0 ? `; ${f.num_cached_tokens} prompt tokens came from the prefix cache` : '') + '.');
    }
    if ((r.finished || []).length > 12) say('fin', `… and ${r.finished.length - 12} more finished.`);
    freed(r, ev, state, say, name, plural);
    const reg = ev.registered || [];
    if (reg.length) say('hit', `Prefix cache: ${plural(reg.length, 'full block')} registered by hash; a later prompt that ` +
      'starts with the same tokens will reuse them instead of computing them.');
    const evicted = ev.evicted || [];
    if (evicted.length) say('pre', `Evicted: ${plural(evicted.length, 'cached block')} handed out for new data, their hash ` +
      'forgotten (cached blocks are only reclaimed when the free list needs them, least recently used first).');
    for (const [sid, n] of ev.rejected || []) say('pre', `Rejected: ${name(sid)} — its ${n}-token prompt can never fit (max_model_len or the whole pool).`);
    return out.slice(0, MAX_LINES);
  }

  function freed(r, ev, state, say, name, plural) {
    const bySeq = groupBy(ev.freed || [], (x) => x[1]);
    for (const [sid, list] of bySeq) {
      const kept = list.filter((x) => x[2] > 0).length;
      const cached = list.filter((x) => x[2] === 0 && state.cached[x[0]]).length;
      const free = list.length - kept - cached;
      const parts = [];
      if (free) parts.push(`${free} back on the free list`);
      if (cached) parts.push(`${cached} free but kept in the prefix cache (a later prompt with the same start revives them)`);
      if (kept) parts.push(`${kept} still used by other sequences (ref_count drops, the block stays)`);
      say('fin', `Freed: ${name(sid)} released ${plural(list.length, 'block')}: ${parts.join('; ')}.`);
    }
  }

  function groupBy(list, key) {
    const m = new Map();
    for (const x of list) { const k = key(x); if (!m.has(k)) m.set(k, []); m.get(k).push(x); }
    return m;
  }
  function countBy(list, key) {
    const m = new Map();
    for (const x of list) { const k = key(x); m.set(k, (m.get(k) || 0) + 1); }
    return m;
  }
  const pct = (a, b) => (b ? `${((a / b) * 100).toFixed(0)}%` : '–');
  const ms = (s) => (s * 1000 >= 10 ? `${(s * 1000).toFixed(0)} ms` : `${(s * 1000).toFixed(1)} ms`);

  // Whether a record holds an event the user asked to stop at ("pause on"): a description, else null.
  function pauseReason(rec, on) {
    if (!rec || !rec.events && !rec.preempted) return null;
    const ev = rec.events || {};
    if (on.preempt && (rec.preempted || []).length) return `preemption of seq ${rec.preempted.map((x) => x[0]).join(', ')}`;
    if (on.swap && ((ev.swapped_out || []).length || (ev.swapped_in || []).length)) return 'a swap between GPU and CPU blocks';
    if (on.hit && (ev.prefix_hits || []).length) return `a prefix-cache hit (${ev.prefix_hits.length} blocks reused)`;
    if (on.cow && ((ev.cow || []).length || (ev.forks || []).length)) return 'a fork or copy-on-write';
    return null;
  }

  PC.explain = explain;
  PC.pauseReason = pauseReason;
})(window.PC);
