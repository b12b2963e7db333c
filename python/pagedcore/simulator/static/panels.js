// Panels: the three queues, the figures, a sequence's block table and the step log, as DOM.
// Rebuilt at most once per animation frame, and only when the state changed.
'use strict';

(function (PC) {
  const MAX_CHIPS = 120;      // per queue; past it "+N more" (200+ requests stay cheap to draw)
  const MAX_LOG_LINES = 80;
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' }[c]));
  const ms = (v) => (v === null || v === undefined ? '–' : v >= 10 ? `${v.toFixed(0)} ms` : `${v.toFixed(1)} ms`);

  function renderQueues(el, state, selected, mine) {
    const blurb = { waiting: 'not yet scheduled (FCFS)', running: 'in the batch, holding GPU blocks',
      swapped: 'preempted, KV in CPU memory' };
    el.innerHTML = PC.QUEUES.map((q) => {
      const ids = state.queues[q];
      const chips = ids.slice(0, MAX_CHIPS).map((sid) => chip(state, sid, selected, mine)).join('');
      const more = ids.length > MAX_CHIPS ? `<span class="more">+${ids.length - MAX_CHIPS} more</span>` : '';
      return `<div class="queue" data-queue="${q}"><h4>${q} · ${ids.length} <small>${blurb[q]}</small></h4>` +
        `<div class="items">${chips}${more}</div></div>`;
    }).join('');
  }

  function chip(state, sid, selected, mine) {
    const s = state.seqs.get(sid);
    if (!s) return '';
    const h = PC.requestHue(s.request_id);
    const frac = s.num_tokens ? s.num_computed_tokens / s.num_tokens : 0;
    const cls = 'req' + (sid === selected ? ' sel' : '') + (mine.has(s.request_id) ? ' mine' : '');
    const title = `seq ${sid} · ${s.request_id}\nnum_computed_tokens ${s.num_computed_tokens} / num_tokens ${s.num_tokens}` +
      ` (prompt ${s.num_prompt_tokens})\nblocks ${s.block_table.length}` + (s.num_preemptions ? `\npreempted ${s.num_preemptions}×` : '');
    return `<span class="${cls}" data-seq="${sid}" data-request="${esc(s.request_id)}" style="background:hsl(${h},70%,58%)" ` +
      `title="${esc(title)}">${sid}${s.lora_name ? `<span class="lora" title="adapter">${esc(s.lora_name)}</span>` : ''}<span class="bar" style="width:${(frac * 100).toFixed(0)}%"></span></span>`;
  }

  function renderMetrics(el, state) {
    const cfg = state.config || {}, st = state.stats || {}, last = state.history[state.history.length - 1];
    const ttft = state.finished.map((f) => f.ttft).filter((v) => v !== null).map((v) => v * 1000);
    const tpot = state.finished.map((f) => f.tpot).filter((v) => v !== null).map((v) => v * 1000);
    // Throughput over the last ten seconds of the trace's own clock.
    const recent = state.history.filter((r) => r.time >= state.time - 10);
    const span = recent.length > 1 ? recent[recent.length - 1].time - recent[0].time + (recent[0].dt || 0) : 0;
    const gen = recent.reduce((a, r) => a + (r.generated || 0), 0);
    const hit = st.prefix_query_tokens ? st.prefix_hit_tokens / st.prefix_query_tokens : 0;
    const cells = [
      ['step', state.step], ['output tokens/s (10 s)', span > 0 ? (gen / span).toFixed(1) : '–'],
      ['TTFT p50 / p90', `${ms(PC.percentile(ttft, 50))} / ${ms(PC.percentile(ttft, 90))}`],
      ['TPOT p50 / p90', `${ms(PC.percentile(tpot, 50))} / ${ms(PC.percentile(tpot, 90))}`],
      ['kv_cache_usage', `${((st.usage || 0) * 100).toFixed(1)}%`],
      ['free blocks (cached)', `${st.num_free_blocks ?? '–'} (${st.num_cached_free_blocks ?? 0})`],
      ['prefix hit rate', `${(hit * 100).toFixed(1)}%`], ['preemptions', st.num_preemptions ?? 0],
      ['evictions', st.num_evictions ?? 0], ['finished', state.finished.length],
    ];
    let html = cells.map(([k, v]) => `<div class="metric"><div class="v">${v}</div><div class="k">${k}</div></div>`).join('');
    if (last) {
      html += budget('tokens this step', last.prefill + last.decode, cfg.max_num_batched_tokens, 'max_num_batched_tokens');
      html += budget('sequences this step', last.seqs, cfg.max_num_seqs, 'max_num_seqs');
    }
    el.innerHTML = html;
  }

  function budget(label, used, max, name) {
    const f = max ? Math.min(1, used / max) : 0;
    return `<div class="budget"><div class="k">${label}: <b>${used}</b> of ${name} ${max}</div>` +
      `<div class="track"><div class="fill" style="width:${(f * 100).toFixed(1)}%"></div></div></div>`;
  }

  function renderBlockTable(el, state, sid) {
    const s = sid === null ? null : state.seqs.get(sid);
    if (!s) {
      el.innerHTML = '<div class="note">Click a request in a queue, or a block in the grid, to see its block table.</div>';
      return;
    }
    const bs = state.config.block_size, onCpu = s.status === 'swapped';
    const kv = (k, v) => `${k} <b>${v}</b>`;
    let html = `<div class="kv">${[kv('seq', sid), kv('request', esc(s.request_id)), kv('status', s.status),
      kv('num_prompt_tokens', s.num_prompt_tokens), kv('num_tokens', s.num_tokens),
      kv('num_computed_tokens', s.num_computed_tokens), kv('num_cached_tokens', s.num_cached_tokens),
      kv('num_preemptions', s.num_preemptions)].concat(optional(s).map(([k, v]) => kv(k, esc(v)))).join(' · ')}</div><div class="btable">`;
    s.block_table.forEach((b, i) => {
      const filled = Math.max(0, Math.min(bs, (onCpu ? s.num_tokens : s.num_computed_tokens) - i * bs));
      const ref = onCpu ? 1 : state.ref[b];
      const cls = 'lb' + (ref > 1 ? ' shared' : '') + (onCpu ? ' cpu' : '');
      html += `<div class="${cls}" title="logical block ${i} → ${onCpu ? 'CPU' : 'GPU'} block ${b}, ${filled}/${bs} slots` +
        `${ref > 1 ? `, shared (ref_count ${ref})` : ''}${!onCpu && state.cached[b] ? ', in the prefix cache' : ''}">` +
        `L${i}<br><span class="phys">${onCpu ? 'cpu ' : 'B'}${b}</span>${ref > 1 ? ` ×${ref}` : ''}` +
        `<div class="fill" style="width:${(filled / bs) * 100}%"></div></div>`;
    });
    if (!s.block_table.length) html += '<div class="note">no blocks (waiting, or preempted by recompute)</div>';
    el.innerHTML = html + '</div>';
  }

  // The last record in words, with the engine's names for everything.
  function renderLog(el, state) {
    const r = state.last;
    if (!r) { el.innerHTML = '<div class="note">no step yet</div>'; return; }
    const name = (sid) => `seq ${sid}`;
    const lines = [];
    const add = (cls, text) => lines.push(`<div class="${cls}">${esc(text)}</div>`);
    if (r.kind === 'step') {
      add('', `step ${r.step}` + (r.timing ? ` · ${(r.timing.total * 1000).toFixed(1)} ms` : '') +
        ` · ${r.num_tokens} tokens (prefill ${r.num_prefill_tokens}, decode ${r.num_decode_tokens}) · ${r.num_seqs} seqs`);
    } else add('', 'between steps: requests ended (abort)');
    const kinds = ['prefill', 'decode', 'recompute', 'verify (drafts)'];
    const chunks = (r.scheduled || []).filter((x) => x[3] !== 1);
    for (const [sid, n, c, k] of chunks.slice(0, 20)) add('', `SCHEDULE ${name(sid)}: ${kinds[k]} chunk of ${n} tokens [${c}, ${c + n})`);
    const decodes = (r.scheduled || []).filter((x) => x[3] === 1).length;
    if (decodes) add('', `SCHEDULE ${decodes} seqs: decode 1 token each`);
    const ev = r.events || {};
    const list = (key, label, fmt, cls = 'ev') => { if (ev[key] && ev[key].length) add(cls, `${label} ×${ev[key].length}: ` + ev[key].slice(0, 16).map(fmt).join(' ') + (ev[key].length > 16 ? ' …' : '')); };
    list('prefix_hits', 'PREFIX_HIT', ([b, sid, ref]) => `B${b}→${name(sid)}(ref ${ref})`, 'hit');
    list('allocated', 'ALLOCATE', ([b, sid]) => `B${b}→${sid}`);
    list('cow', 'COPY_ON_WRITE', ([src, dst, sid]) => `B${src}⇒B${dst}(${name(sid)})`);
    list('freed', 'FREE', ([b, sid, ref]) => `B${b}${ref ? `(ref ${ref})` : ''}`);
    list('registered', 'CACHE_REGISTER', (b) => `B${b}`, 'hit');
    list('evicted', 'EVICT', (b) => `B${b}`, 'pre');
    list('swapped_out', 'SWAP_OUT', ([g, c]) => `B${g}→cpu${c}`, 'pre');
    list('swapped_in', 'SWAP_IN', ([c, g]) => `cpu${c}→B${g}`);
    list('forks', 'FORK', ([child, parent]) => `${name(parent)}→${child}`);
    list('rejected', 'REJECT', ([sid, n]) => `${name(sid)} (${n} prompt tokens)`, 'pre');
    if (r.spec && r.spec.num_draft_tokens) {
      add('hit', `SPEC_DECODE num_draft_tokens ${r.spec.num_draft_tokens}, num_accepted_tokens ${r.spec.num_accepted_tokens}: ` +
        (r.spec.seqs || []).slice(0, 16).map(([sid, k, a]) => `${name(sid)} ${a}/${k}`).join(' '));
    }
    for (const [sid, mode] of r.preempted || []) add('pre', `PREEMPT ${name(sid)} by ${mode}` + (mode === 'swap' ? ' (KV to CPU)' : ' (KV dropped, back to waiting)'));
    for (const f of (r.finished || []).slice(0, 20)) {
      add('fin', `FINISH ${name(f.seq_id)} ${f.request_id}: ${f.reason}, ${f.num_output_tokens} tokens` +
        (f.ttft !== null ? `, TTFT ${ms(f.ttft * 1000)}` : '') + (f.tpot !== null ? `, TPOT ${ms(f.tpot * 1000)}` : ''));
    }
    el.innerHTML = lines.slice(0, MAX_LOG_LINES).join('');
  }

  // Fields other features put on a sequence (adapters, beams, drafts): shown when the trace carries them.
  const OPTIONAL_SEQ_FIELDS = ['lora_name', 'beam_width', 'n', 'num_draft_tokens', 'num_accepted_tokens', 'priority'];
  function optional(s) { return OPTIONAL_SEQ_FIELDS.filter((k) => s[k] !== undefined && s[k] !== null).map((k) => [k, s[k]]); }

  function renderExplain(el, state) {
    el.innerHTML = PC.explain(state).map(([cls, text]) => `<div class="${cls}">${esc(text)}</div>`).join('');
  }

  function renderConfig(el, cfg) {
    if (!cfg) { el.innerHTML = ''; return; }
    const keys = ['model', 'num_gpu_blocks', 'num_cpu_blocks', 'block_size', 'max_num_seqs', 'max_num_batched_tokens',
      'max_model_len', 'enable_prefix_caching', 'enable_chunked_prefill', 'preemption_mode', 'policy',
      'num_speculative_tokens', 'speculative_method', 'max_loras', 'tensor_parallel_size', 'pipeline_parallel_size'];
    el.innerHTML = keys.filter((k) => cfg[k] !== undefined && cfg[k] !== null).map((k) => {
      const v = k === 'model' ? String(cfg[k]).split('/').pop() : cfg[k];
      return `<span class="chip-config">${k} <b>${esc(v)}</b></span>`;
    }).join('');
  }

  PC.panels = { renderQueues, renderMetrics, renderBlockTable, renderLog, renderConfig, renderExplain, esc };
})(window.PC);
