// The "Compare policies" tab: a workload and engine knobs in, POST /simulator/simulate, a table and
// bar charts of every policy out; any policy's run can be replayed step by step in the Engine tab.
'use strict';

(function (PC) {
  const $ = (id) => document.getElementById(id);
  const FIELDS = [   // [section, name, default, help]
    ['workload', 'num_requests', 1000, 'requests in the workload'],
    ['workload', 'request_rate', 0, 'requests/s (Poisson); 0 = all at once'],
    ['workload', 'shared_prefix_len', 256, 'tokens of a shared system prompt'],
    ['workload', 'num_prefix_groups', 4, 'distinct system prompts'],
    ['workload', 'min_prompt_len', 32, 'own prompt tokens, min'], ['workload', 'max_prompt_len', 512, 'own prompt tokens, max'],
    ['workload', 'min_output_len', 8, 'generated tokens, min'], ['workload', 'max_output_len', 256, 'generated tokens, max'],
    ['config', 'num_gpu_blocks', 2048, 'KV blocks'], ['config', 'block_size', 16, 'tokens per block'],
    ['config', 'max_num_seqs', 128, 'sequences per step'], ['config', 'max_num_batched_tokens', 2048, 'token budget per step'],
  ];
  const POLICIES = ['continuous', 'static', 'swap', 'no-prefix-caching', 'no-chunked-prefill', 'block-size-8', 'block-size-32'];
  const CHARTS = [   // [title, value of a result, format, higher is better]
    ['output tokens/s', (m) => m.throughput_tokens_per_s, (v) => v.toFixed(0), true],
    ['TTFT p50 (ms)', (m) => m.ttft_ms.p50, (v) => v.toFixed(0), false],
    ['TPOT p50 (ms)', (m) => m.tpot_ms.p50, (v) => v.toFixed(1), false],
    ['batch occupancy (of max_num_seqs)', (m) => m.batch_occupancy * 100, (v) => v.toFixed(0) + '%', true],
    ['KV usage (time-weighted)', (m) => m.kv_usage * 100, (v) => v.toFixed(0) + '%', true],
    ['KV waste: paged | contiguous max_model_len (dim bar)', (m) => m.kv_waste * 100, (v) => v.toFixed(1) + '%', false, (m) => m.kv_waste_contiguous * 100],
    ['prefill tokens computed', (m) => m.num_prefill_tokens, (v) => (v / 1000).toFixed(0) + 'k', false],
    ['preemptions', (m) => m.num_preemptions, (v) => v.toFixed(0), false],
  ];
  let last = null;       // the last comparison's response
  let lastBody = null;   // the form as last run: "watch" re-runs one policy of it with its trace

  function buildForm() {
    const form = $('sim-form');
    form.innerHTML = FIELDS.map(([sec, name, def, help]) =>
      `<label title="${help}">${name} <input type="number" step="any" data-sec="${sec}" name="${name}" value="${def}"></label>`).join('') +
      `<fieldset><legend>policies</legend>${POLICIES.map((p) =>
        `<label style="display:inline-flex;margin-right:12px"><input type="checkbox" name="policy" value="${p}" checked> ${p}</label>`).join('')}</fieldset>`;
    form.onsubmit = (e) => e.preventDefault();
  }

  async function run() {
    const body = { workload: {}, config: {}, policies: [], trace_policy: 'continuous' };
    for (const input of $('sim-form').querySelectorAll('input[data-sec]')) body[input.dataset.sec][input.name] = +input.value;
    for (const box of $('sim-form').querySelectorAll('input[name=policy]:checked')) body.policies.push(box.value);
    body.trace_policy = null;        // the table needs no trace; "watch" asks for one
    lastBody = JSON.parse(JSON.stringify(body));
    $('sim-status').textContent = 'simulating…';
    const key = localStorage.getItem('pagedcore-api-key');
    const resp = await fetch('/simulator/simulate', { method: 'POST', body: JSON.stringify(body),
      headers: Object.assign({ 'Content-Type': 'application/json' }, key ? { Authorization: 'Bearer ' + key } : {}) });
    const data = await resp.json();
    if (!resp.ok) { $('sim-status').textContent = `error: ${(data.error && data.error.message) || JSON.stringify(data)}`; return; }
    last = data;
    $('sim-status').textContent = `${data.results.length} policies, ${data.workload.num_requests} requests each, in ${data.wall_seconds} s` +
      ` · cost model: ${data.cost_model.source}`;
    renderTable(data);
    renderCharts(data);
  }

  function renderTable(data) {
    const esc = PC.panels.esc;
    const best = Math.max(...data.results.map((r) => r.metrics.throughput_tokens_per_s));
    const rows = data.results.map((r) => {
      const m = r.metrics;
      const cells = [r.policy, m.throughput_tokens_per_s.toFixed(0), m.requests_per_s.toFixed(2),
        `${fmt(m.ttft_ms.p50)} / ${fmt(m.ttft_ms.p99)}`, `${fmt(m.tpot_ms.p50)} / ${fmt(m.tpot_ms.p99)}`,
        pct(m.batch_occupancy), pct(m.kv_usage), pct(m.kv_waste, 1), pct(m.kv_waste_contiguous), m.num_preemptions,
        m.num_prefill_tokens, pct(m.prefix_hit_rate), m.num_steps];
      return `<tr class="${m.throughput_tokens_per_s === best ? 'best' : ''}">${cells.map((c) => `<td>${esc(c)}</td>`).join('')}` +
        `<td><button data-watch="${esc(r.policy)}">watch</button></td></tr>`;
    }).join('');
    $('sim-table').innerHTML = `<table class="results"><tr>${['policy', 'out tok/s', 'req/s', 'TTFT p50/p99 ms',
      'TPOT p50/p99 ms', 'batch occ', 'KV use', 'KV waste', 'contig waste', 'preempt', 'prefill tok', 'prefix hit', 'steps', '']
      .map((h) => `<th>${h}</th>`).join('')}</tr>${rows}</table>` +
      '<div class="note">KV waste: allocated but unwritten slots (tails of last blocks); contig waste: what reserving ' +
      'max_model_len per request without paging would leave unused. “watch” replays that policy’s first steps in the Engine tab.</div>';
    $('sim-table').querySelectorAll('[data-watch]').forEach((b) => { b.onclick = () => watch(b.dataset.watch); });
  }

  // Re-runs the comparison for one policy with its trace, then replays it in the Engine tab.
  async function watch(policy) {
    const body = Object.assign({}, lastBody, { policies: [policy], trace_policy: policy });
    $('sim-status').textContent = `tracing ${policy}…`;
    const resp = await fetch('/simulator/simulate', { method: 'POST', body: JSON.stringify(body), headers: { 'Content-Type': 'application/json' } });
    const data = await resp.json();
    if (!resp.ok || !data.trace) { $('sim-status').textContent = 'no trace came back'; return; }
    PC.app.loadRecords(data.trace, `simulation: ${policy}`);
    PC.app.showEngineTab();
  }

  function renderCharts(data) {
    const host = $('sim-charts');
    host.innerHTML = '';
    for (const [title, value, format, higher, second] of CHARTS) {
      const panel = document.createElement('div');
      panel.className = 'panel';
      panel.innerHTML = `<h2>${title}<small>${higher ? 'higher is better' : 'lower is better'}</small></h2>`;
      const cv = document.createElement('canvas');
      cv.style.height = 24 * data.results.length + 10 + 'px';
      panel.appendChild(cv);
      host.appendChild(panel);
      bars(cv, data.results.map((r) => [r.policy, value(r.metrics) ?? 0, second ? second(r.metrics) : null]), format);
    }
  }

  function bars(cv, rows, format) {
    const dpr = window.devicePixelRatio || 1, w = cv.clientWidth || 360, h = cv.clientHeight;
    cv.width = w * dpr; cv.height = h * dpr;
    const ctx = cv.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const max = Math.max(1e-9, ...rows.map((r) => Math.max(r[1], r[2] || 0)));
    const x0 = 130, x1 = w - 60;
    ctx.font = '11px sans-serif';
    ctx.textBaseline = 'middle';
    rows.forEach(([name, v, v2], i) => {
      const y = 5 + i * 24;
      ctx.fillStyle = '#d8dde8'; ctx.textAlign = 'right'; ctx.fillText(name, x0 - 6, y + 9);
      if (v2 !== null) { ctx.fillStyle = '#4a3550'; ctx.fillRect(x0, y + 1, (v2 / max) * (x1 - x0), 16); }
      ctx.fillStyle = `hsl(${(i * 137.5) % 360},60%,60%)`;
      ctx.fillRect(x0, y + 4, (v / max) * (x1 - x0), 10);
      ctx.fillStyle = '#d8dde8'; ctx.textAlign = 'left';
      ctx.fillText(format(v) + (v2 !== null ? ` | ${format(v2)}` : ''), x0 + (Math.max(v, v2 || 0) / max) * (x1 - x0) + 4, y + 9);
    });
  }

  const fmt = (v) => (v === null ? '–' : v >= 100 ? v.toFixed(0) : v.toFixed(1));
  const pct = (v, d = 0) => (v * 100).toFixed(d) + '%';

  buildForm();
  $('btn-simulate').onclick = run;
  PC.simulate = { run };
})(window.PC);
