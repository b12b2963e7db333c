// BlockGrid: the physical KV blocks on a canvas, one cell per block, coloured by owner and state.
//   free: dark · cached (free, but its hash still finds it: a prefix hit revives it): owner's hue, dim
//   allocated (ref_count 1): owner's hue · shared (ref_count > 1): owner's hue, white frame, the count
//   CPU grid: swapped-out blocks in their owner's hue.  This step: new blocks framed yellow, freed red.
'use strict';

(function (PC) {
  const COLORS = { free: '#242a38', cachedMark: '#c792ea', allocated: '#ffd166', freed: '#ff6b6b', select: '#ffffff' };

  class BlockGrid {
    constructor(canvas, kind, tooltip, onSelect) {
      this.canvas = canvas;
      this.kind = kind;            // 'gpu' | 'cpu'
      this.tooltip = tooltip;
      this.onSelect = onSelect;
      this.cell = 16;
      this.cols = 1;
      this.state = null;
      canvas.addEventListener('mousemove', (e) => this.hover(e));
      canvas.addEventListener('mouseleave', () => { this.tooltip.hidden = true; });
      canvas.addEventListener('click', (e) => {
        const b = this.blockAt(e);
        if (b === null || !this.state) return;
        const owner = this.kind === 'gpu' ? this.ownerOf(b) : this.state.cpuOwner[b];
        if (owner >= 0) this.onSelect(owner);
      });
    }

    numBlocks(state) {
      if (!state.config) return 0;
      return this.kind === 'gpu' ? state.config.num_gpu_blocks : state.config.num_cpu_blocks;
    }

    // Cells shrink with the pool so that 10k blocks still fit on a screen.
    layout(n, maxHeight) {
      const width = this.canvas.parentElement.clientWidth || 600;
      let cell = 28;
      while (cell > 5 && Math.ceil(n / Math.floor(width / cell)) * cell > maxHeight) cell--;
      this.cell = cell;
      this.cols = Math.max(1, Math.floor(width / cell));
      const rows = Math.max(1, Math.ceil(n / this.cols));
      const dpr = window.devicePixelRatio || 1;
      const h = n ? rows * cell : 0;
      if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(h * dpr)) {
        this.canvas.width = Math.round(width * dpr);
        this.canvas.height = Math.round(h * dpr);
        this.canvas.style.height = h + 'px';
      }
      return dpr;
    }

    draw(state, selected, maxHeight) {
      this.state = state;
      const n = this.numBlocks(state);
      const dpr = this.layout(n, maxHeight);
      const ctx = this.canvas.getContext('2d');
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
      const c = this.cell, gap = c >= 10 ? 1 : 0;
      const hl = this.highlights(state.last);
      const selectedBlocks = new Set(selected !== null && state.seqs.has(selected) ? state.seqs.get(selected).block_table : []);
      const selectedOnCpu = selected !== null && state.seqs.has(selected) && state.seqs.get(selected).status === 'swapped';
      ctx.font = `${Math.max(8, Math.floor(c * 0.5))}px sans-serif`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      for (let b = 0; b < n; b++) {
        const x = (b % this.cols) * c, y = Math.floor(b / this.cols) * c;
        const owner = this.kind === 'gpu' ? state.owner[b] : state.cpuOwner[b];
        const st = this.kind === 'gpu' ? state.blockState(b) : (owner >= 0 ? 'allocated' : 'free');
        ctx.fillStyle = this.fill(state, st, owner);
        ctx.fillRect(x + gap, y + gap, c - 2 * gap, c - 2 * gap);
        if (st === 'cached' && c >= 8) {
          ctx.fillStyle = COLORS.cachedMark;
          ctx.fillRect(x + gap, y + c - gap - 2, c - 2 * gap, 2);
        }
        if (st === 'shared') {
          ctx.strokeStyle = '#fff';
          ctx.lineWidth = 1;
          ctx.strokeRect(x + gap + 0.5, y + gap + 0.5, c - 2 * gap - 1, c - 2 * gap - 1);
          if (c >= 13) { ctx.fillStyle = '#0b0d12'; ctx.fillText(String(state.ref[b]), x + c / 2, y + c / 2 + 0.5); }
        }
        const mark = hl.get(b);
        const chosen = selectedBlocks.has(b) && (this.kind === 'gpu') !== selectedOnCpu;
        if (mark || chosen) {
          ctx.strokeStyle = chosen ? COLORS.select : COLORS[mark];
          ctx.lineWidth = 2;
          ctx.strokeRect(x + 1, y + 1, c - 2, c - 2);
        }
      }
    }

    fill(state, st, owner) {
      if (st === 'free' || owner < 0) return COLORS.free;
      const h = PC.requestHue(state.requestNames.get(owner) ?? owner);
      if (st === 'cached') return `hsl(${h},30%,30%)`;
      return `hsl(${h},70%,${st === 'shared' ? 68 : 58}%)`;
    }

    // block -> 'allocated' | 'freed' for what the last record did to this pool
    highlights(rec) {
      const m = new Map();
      if (!rec || !rec.events) return m;
      const ev = rec.events;
      if (this.kind === 'gpu') {
        for (const [b, , ref] of ev.freed || []) if (ref === 0) m.set(b, 'freed');
        for (const [b] of ev.allocated || []) m.set(b, 'allocated');
        for (const [b] of ev.prefix_hits || []) m.set(b, 'allocated');
      } else {
        for (const [, c] of ev.swapped_out || []) m.set(c, 'allocated');
        for (const [c] of ev.swapped_in || []) m.set(c, 'freed');
      }
      return m;
    }

    ownerOf(b) {
      const holders = this.state.holders().get(b);
      return holders ? holders[0][0] : this.state.owner[b];
    }

    blockAt(e) {
      const r = this.canvas.getBoundingClientRect();
      const col = Math.floor((e.clientX - r.left) / this.cell), row = Math.floor((e.clientY - r.top) / this.cell);
      const b = row * this.cols + col;
      return col < this.cols && b >= 0 && this.state && b < this.numBlocks(this.state) ? b : null;
    }

    hover(e) {
      const b = this.blockAt(e);
      if (b === null) { this.tooltip.hidden = true; return; }
      this.tooltip.textContent = this.describe(b);
      this.tooltip.style.left = e.clientX + 14 + 'px';
      this.tooltip.style.top = e.clientY + 10 + 'px';
      this.tooltip.hidden = false;
    }

    describe(b) {
      const s = this.state, name = (sid) => `seq ${sid} (${s.requestNames.get(sid) ?? '?'})`;
      if (this.kind === 'cpu') {
        const o = s.cpuOwner[b];
        return o < 0 ? `CPU block ${b}: free` : `CPU block ${b}: swapped-out KV of ${name(o)}`;
      }
      const st = s.blockState(b), lines = [`block ${b}: ${st}  ref_count ${s.ref[b]}`];
      for (const [sid, i] of s.holders().get(b) || []) lines.push(`  logical block ${i} of ${name(sid)}`);
      if (s.cached[b]) lines.push(st === 'cached' ? '  free, but its hash still finds it (prefix cache)' : '  registered in the prefix cache');
      if (s.owner[b] >= 0) lines.push(`  computed by ${name(s.owner[b])}`);
      return lines.join('\n');
    }
  }

  PC.BlockGrid = BlockGrid;
  PC.GRID_COLORS = COLORS;
})(window.PC);
