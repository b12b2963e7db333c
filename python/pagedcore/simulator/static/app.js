// The page's wiring: one EngineState fed by a Feed, drawn by the grids, the timeline and the panels in
// one requestAnimationFrame callback whenever something changed; plus the controls, the chat box and
// the workload button. window.PC exposes it all (the browser tests read PC.state.digest()).
'use strict';

(function (PC) {
  const $ = (id) => document.getElementById(id);
  const state = new PC.EngineState();
  const mine = new Set();           // request ids sent from this page
  let selected = null;
  let dirty = true;
  let info = { live: false };

  const status = (text, cls) => { const el = $('source-status'); el.textContent = text; el.className = 'status ' + (cls || ''); };
  const feed = new PC.Feed(state, () => { dirty = true; }, status);
  const select = (sid) => { selected = sid; dirty = true; };
  const tooltip = $('tooltip');
  const gpuGrid = new PC.BlockGrid($('gpu-grid'), 'gpu', tooltip, select, $('gpu-minimap'));
  const cpuGrid = new PC.BlockGrid($('cpu-grid'), 'cpu', tooltip, select);
  const timeline = new PC.Timeline($('timeline'), (step) => feed.seekStep(step));
  let lastConfig = null;

  function render() {
    const cfg = state.config;
    if (cfg !== lastConfig) { PC.panels.renderConfig($('config-chips'), cfg); lastConfig = cfg; }
    if (selected === null || !state.seqs.has(selected)) {
      // follow the user's own request when there is one in flight
      for (const [sid, s] of state.seqs) if (mine.has(s.request_id)) { selected = sid; break; }
    }
    gpuGrid.draw(state, selected, 520);
    cpuGrid.draw(state, selected, 120);
    timeline.draw(state);
    PC.panels.renderQueues($('queues'), state, selected, mine);
    PC.panels.renderMetrics($('metrics'), state);
    PC.panels.renderBlockTable($('block-table'), state, selected);
    PC.panels.renderLog($('step-log'), state);
    PC.panels.renderExplain($('step-explain'), state);
    if (cfg) {
      const st = state.stats || {}, L = gpuGrid.layout;
      $('grid-caption').textContent = `${cfg.num_gpu_blocks.toLocaleString('en-US')} blocks × block_size ${cfg.block_size} tokens · ` +
        `free ${(st.num_free_blocks ?? cfg.num_gpu_blocks).toLocaleString('en-US')} (cached ${st.num_cached_free_blocks ?? 0})` +
        (L && L.folded ? ' · long free runs folded: “free ×N”; the strip above is the whole pool' : '');
      $('cpu-caption').textContent = cfg.num_cpu_blocks ? `${cfg.num_cpu_blocks} blocks (preemption_mode swap)` :
        'none (num_cpu_blocks 0: preemption recomputes)';
    }
  }

  function frame(now) {
    if (feed.tick(now)) dirty = true;
    if (dirty) { dirty = false; render(); }
    requestAnimationFrame(frame);
  }

  function legend() {
    const c = PC.GRID_COLORS, h = 200;
    const items = [[c.free, 'free'], [c.gap, 'free ×N: a folded run of free blocks'],
      [`hsl(${h},30%,30%)`, 'cached (free, prefix-cache reusable)', c.cachedMark],
      [`hsl(${h},70%,58%)`, 'allocated (request colour)'], [`hsl(${h},70%,68%)`, 'shared: ref_count > 1', '#fff'],
      [`linear-gradient(225deg, ${c.cachedMark} 30%, hsl(${h},70%,58%) 30%)`, 'allocated, in the prefix cache'],
      ['transparent', 'allocated this step', c.allocated], ['transparent', 'prefix hit this step', c.hit],
      ['transparent', 'copy-on-write this step', c.cow], ['transparent', 'freed this step', c.freed],
      ['transparent', 'selected request', c.select]];
    $('legend').innerHTML = items.map(([fill, label, border]) =>
      `<span><i style="background:${fill};${border ? `box-shadow: inset 0 0 0 2px ${border}` : ''}"></i>${label}</span>`).join('');
  }

  // -- controls ---------------------------------------------------------------------------------------
  $('btn-play').onclick = () => feed.play();
  $('btn-pause').onclick = () => feed.pause();
  $('btn-step').onclick = () => feed.stepOnce();
  $('btn-end').onclick = () => feed.toEnd();
  $('speed').onchange = (e) => { feed.speed = +e.target.value; };
  for (const k of ['preempt', 'swap', 'hit', 'cow']) {
    const box = $('pause-' + k);
    box.checked = localStorage.getItem('pagedcore-pause-' + k) === '1';
    feed.pauseOn[k] = box.checked;
    box.onchange = () => { feed.pauseOn[k] = box.checked; localStorage.setItem('pagedcore-pause-' + k, box.checked ? '1' : '0'); };
  }
  $('btn-live').onclick = () => startLive();
  $('trace-file').onchange = async (e) => {
    const f = e.target.files[0];
    if (!f) return;
    try { feed.loadText(await f.text(), f.name); } catch (err) { status(`cannot read ${f.name}: ${err.message}`, 'error'); }
  };
  document.querySelectorAll('.tab').forEach((b) => {
    b.onclick = () => {
      document.querySelectorAll('.tab').forEach((x) => x.classList.toggle('active', x === b));
      document.querySelectorAll('.tab-page').forEach((p) => { p.hidden = p.id !== 'tab-' + b.dataset.tab; });
      dirty = true;
    };
  });
  $('queues').addEventListener('click', (e) => {
    const el = e.target.closest('[data-seq]');
    if (el) select(+el.dataset.seq);
  });
  window.addEventListener('resize', () => { dirty = true; });

  const apiKey = $('api-key');
  apiKey.value = localStorage.getItem('pagedcore-api-key') || '';
  apiKey.onchange = () => localStorage.setItem('pagedcore-api-key', apiKey.value);
  const headers = () => Object.assign({ 'Content-Type': 'application/json' },
    apiKey.value ? { Authorization: 'Bearer ' + apiKey.value } : {});

  // A streamed chat completion; its id is the engine's request id, so the page can follow it.
  $('btn-send').onclick = async () => {
    const out = $('reply');
    out.textContent = '';
    delete out.dataset.done;
    try {
      const resp = await fetch('/v1/chat/completions', { method: 'POST', headers: headers(), body: JSON.stringify({
        model: info.model, stream: true, max_tokens: +$('prompt-max-tokens').value,
        messages: [{ role: 'user', content: $('prompt').value }] }) });
      if (!resp.ok) { out.textContent = `error ${resp.status}: ${(await resp.text()).slice(0, 400)}`; return; }
      const reader = resp.body.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 2);
          if (!line.startsWith('data:') || line === 'data: [DONE]') continue;
          const chunk = JSON.parse(line.slice(5));
          if (chunk.id && !mine.has(chunk.id)) { mine.add(chunk.id); dirty = true; }
          for (const c of chunk.choices || []) out.textContent += (c.delta && c.delta.content) || '';
        }
      }
    } catch (err) { out.textContent += `\n[${err.message}]`; }
    out.dataset.done = '1';
  };

  $('btn-workload').onclick = async () => {
    const el = $('wl-status');
    el.textContent = 'launching…';
    const resp = await fetch('/simulator/workload', { method: 'POST', headers: headers(), body: JSON.stringify({
      num_requests: +$('wl-n').value, system_prompt_sentences: +$('wl-sys').value, max_tokens: +$('wl-max').value }) });
    const body = await resp.json().catch(() => ({}));
    el.textContent = resp.ok ? `queued ${body.request_ids.length} requests (prompts up to ${body.num_prompt_tokens_max} tokens)`
      : `error ${resp.status}: ${(body.error && body.error.message) || JSON.stringify(body)}`;
  };

  function startLive() {
    if (!info.live) { status(info.why_not_live || 'no live engine here; open a trace file', 'error'); return; }
    feed.connectLive();
  }

  async function start() {
    legend();
    requestAnimationFrame(frame);
    const params = new URLSearchParams(location.search);
    if (location.protocol !== 'file:') {
      try { info = await (await fetch('/simulator/info')).json(); } catch (err) { info = { live: false }; }
    }
    $('download-trace').hidden = !info.live;
    for (const id of ['btn-send', 'btn-workload']) $(id).disabled = location.protocol === 'file:';
    if (params.get('trace')) {
      try {
        const text = await (await fetch(params.get('trace'))).text();
        feed.loadText(text, params.get('trace'));
        if (params.get('play') !== null) feed.play();
      } catch (err) { status(`cannot load ${params.get('trace')}: ${err.message}`, 'error'); }
      return;
    }
    if (info.live) startLive();
    else status(location.protocol === 'file:' ? 'offline: open a trace file (JSONL) to replay it' :
      (info.why_not_live || 'no live engine'), '');
  }

  PC.state = state;
  PC.feed = feed;
  PC.grids = { gpu: gpuGrid, cpu: cpuGrid };
  PC.app = { select, render: () => { dirty = true; }, mine, loadRecords: (r, label) => feed.loadRecords(r, label),
    showEngineTab: () => document.querySelector('.tab[data-tab=engine]').click() };
  start();
})(window.PC);
