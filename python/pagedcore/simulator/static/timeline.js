// Timeline: the last steps as stacked bars of prefill and decode tokens (left axis, with the
// max_num_batched_tokens line), the batch size against max_num_seqs and the KV usage (right axis,
// 0..100%), preemptions as red ticks along the top. Click a bar in a replay to seek there.
'use strict';

(function (PC) {
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  class Timeline {
    constructor(canvas, onSeek) {
      this.canvas = canvas;
      this.onSeek = onSeek;
      this.view = [];
      canvas.addEventListener('click', (e) => {
        const row = this.rowAt(e);
        if (row) this.onSeek(row.step);
      });
      canvas.addEventListener('mousemove', (e) => {
        const row = this.rowAt(e);
        canvas.title = row ? `step ${row.step}: prefill ${row.prefill} + decode ${row.decode} tokens, ` +
          `${row.seqs} seqs, KV ${(row.kv * 100).toFixed(1)}%` + (row.dt ? `, ${(row.dt * 1000).toFixed(1)} ms` : '') +
          (row.preempted ? `, ${row.preempted} preempted` : '') : '';
      });
    }

    rowAt(e) {
      const r = this.canvas.getBoundingClientRect();
      const i = Math.floor((e.clientX - r.left - this.x0) / this.barW);
      return this.view[i] || null;
    }

    draw(state) {
      const cv = this.canvas, dpr = window.devicePixelRatio || 1;
      const w = cv.clientWidth || 600, h = cv.clientHeight || 190;
      if (cv.width !== Math.round(w * dpr)) { cv.width = Math.round(w * dpr); cv.height = Math.round(h * dpr); }
      const ctx = cv.getContext('2d');
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      const cfg = state.config;
      if (!cfg) return;
      const x0 = 34, x1 = w - 34, top = 10, bottom = h - 16;
      const maxBars = Math.max(10, Math.floor((x1 - x0) / 3));
      const rows = state.history.slice(-maxBars);
      this.view = rows;
      this.x0 = x0;
      this.barW = (x1 - x0) / Math.max(rows.length, 60);
      const budget = cfg.max_num_batched_tokens;
      // Scaled to what the steps used, so small decode batches stay visible; the budget line shows
      // when it is in range, else its value is written at the top.
      const yMax = Math.max(16, ...rows.map((r) => r.prefill + r.decode)) * 1.15;
      const y = (v) => bottom - (v / yMax) * (bottom - top);
      const yR = (f) => bottom - f * (bottom - top);
      ctx.fillStyle = '#8a93a6';
      ctx.font = '10px sans-serif';
      ctx.textAlign = 'right';
      ctx.fillText(String(Math.round(yMax)), x0 - 3, top + 8);
      ctx.fillText('0', x0 - 3, bottom);
      ctx.textAlign = 'left';
      ctx.fillText('100%', x1 + 3, top + 8);
      rows.forEach((r, i) => {
        const x = x0 + i * this.barW, bw = Math.max(1, this.barW - 1);
        ctx.fillStyle = css('--prefill');
        ctx.fillRect(x, y(r.prefill), bw, bottom - y(r.prefill));
        ctx.fillStyle = css('--decode');
        ctx.fillRect(x, y(r.prefill + r.decode), bw, y(r.prefill) - y(r.prefill + r.decode));
        if (r.preempted) { ctx.fillStyle = css('--warn'); ctx.fillRect(x, top - 8, bw, 6); }
      });
      // the token budget of one step
      ctx.fillStyle = css('--warn');
      if (budget <= yMax) {
        ctx.strokeStyle = css('--warn');
        ctx.setLineDash([4, 3]);
        ctx.beginPath(); ctx.moveTo(x0, y(budget)); ctx.lineTo(x1, y(budget)); ctx.stroke();
        ctx.setLineDash([]);
        ctx.fillText(`max_num_batched_tokens ${budget}`, x0 + 4, y(budget) - 3);
      } else {
        ctx.fillText(`max_num_batched_tokens ${budget} ↑ (above the scale)`, x0 + 4, top + 8);
      }
      const line = (color, f) => {
        ctx.strokeStyle = color; ctx.lineWidth = 1.5; ctx.beginPath();
        rows.forEach((r, i) => { const x = x0 + (i + 0.5) * this.barW; i ? ctx.lineTo(x, yR(f(r))) : ctx.moveTo(x, yR(f(r))); });
        ctx.stroke(); ctx.lineWidth = 1;
      };
      line(css('--seqs'), (r) => r.seqs / cfg.max_num_seqs);
      line(css('--kv'), (r) => r.kv);
      ctx.fillStyle = '#8a93a6';
      ctx.fillText(rows.length ? `steps ${rows[0].step}–${rows[rows.length - 1].step}` : 'no steps yet', x0, h - 3);
      const legend = [['prefill tokens', css('--prefill')], ['decode tokens', css('--decode')],
        ['batch size / max_num_seqs', css('--seqs')], ['KV usage', css('--kv')], ['preemption', css('--warn')]];
      let lx = x0 + 120;
      for (const [label, color] of legend) {
        ctx.fillStyle = color; ctx.fillRect(lx, h - 10, 8, 8);
        ctx.fillStyle = '#8a93a6'; ctx.fillText(label, lx + 11, h - 3);
        lx += ctx.measureText(label).width + 24;
      }
    }
  }

  PC.Timeline = Timeline;
})(window.PC);
