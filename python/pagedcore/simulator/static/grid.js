// BlockGrid: the physical KV blocks on a canvas, readable at any pool size.
//   A small pool draws one cell per block. A large one (the default server has ~5,800 blocks) folds
//   every long run of free blocks into one "free ×N" pill, so the blocks that hold something keep
//   a readable cell wherever they sit; a minimap strip above draws the whole pool at one pixel per
//   few blocks, so where the action is stays visible too. The layout is grid_layout.js.
//   free: dark · cached (free, but its hash still finds it: a prefix hit revives it): owner's hue, dim,
//   purple bar · allocated (ref_count 1): owner's hue · shared (ref_count > 1): white frame, the count ·
//   registered in the prefix cache while allocated: purple corner · this step: allocated yellow,
//   prefix hit purple, copy-on-write orange, freed red · a selected request: white frame, others dimmed.
'use strict';

(function (PC) {
  const COLORS = { free: '#242a38', gap: '#1c2130', gapText: '#6f7890', cachedMark: '#c792ea', allocated: '#ffd166',
    hit: '#c792ea', cow: '#ff9f43', freed: '#ff6b6b', select: '#ffffff', minimapFree: '#1a1f2b' };

  class BlockGrid {
    constructor(canvas, kind, tooltip, onSelect, minimap) {
      this.canvas = canvas;
      this.kind = kind;            // 'gpu' | 'cpu'
      this.tooltip = tooltip;
      this.onSelect = onSelect;
      this.minimap = minimap || null;
      this.layout = null;          // PC.gridLayout(...) of the last draw
      this.state = null;
      canvas.addEventListener('mousemove', (e) => this.hover(e));
      canvas.addEventListener('mouseleave', () => { this.tooltip.hidden = true; });
      canvas.addEventListener('click', (e) => {
        const item = this.itemAt(e);
        if (!item || item.gap || !this.state) return;
        const owner = this.kind === 'gpu' ? this.ownerOf(item.b0) : this.state.cpuOwner[item.b0];
        if (owner >= 0) this.onSelect(owner);
      });
    }

    numBlocks(state) {
      if (!state.config) return 0;
      return this.kind === 'gpu' ? state.config.num_gpu_blocks : state.config.num_cpu_blocks;
    }

    // Holds something: allocated, cached, or touched by the step just drawn (a freed block's red frame).
    busy(state, b, hl) {
      if (hl.has(b)) return true;
      if (this.kind === 'cpu') return state.cpuOwner[b] >= 0;
      return state.ref[b] > 0 || state.cached[b];
    }

    draw(state, selected, maxHeight) {
      this.state = state;
      const n = this.numBlocks(state);
      const hl = this.highlights(state.last);
      const width = this.canvas.parentElement.clientWidth || 600;
      const L = PC.gridLayout(n, width, maxHeight, (b) => this.busy(state, b, hl));
      this.layout = L;
      const dpr = window.devicePixelRatio || 1;
      if (this.canvas.width !== Math.round(width * dpr) || this.canvas.height !== Math.round(L.height * dpr)) {
        this.canvas.width = Math.round(width * dpr);
        this.canvas.height = Math.round(L.height * dpr);
        this.canvas.style.height = L.height + 'px';
      }
      const ctx = this.canvas.getContext('2d');
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, width, L.height);
      const sel = selected !== null && state.seqs.has(selected) ? state.seqs.get(selected) : null;
      const selOnThisPool = sel && (sel.status === 'swapped') === (this.kind === 'cpu');
      const selectedBlocks = new Set(selOnThisPool ? sel.block_table : []);
      const c = L.cell, gap = c >= 10 ? 1 : 0;
      ctx.font = `${Math.max(8, Math.floor(c * 0.5))}px sans-serif`;
      ctx.textAlign = 'center';
      ctx.textBaseline = 'middle';
      for (const it of L.items) {
        if (it.gap) { this.drawGap(ctx, it, c); continue; }
        const b = it.b0, x = it.x, y = it.y;
        const owner = this.kind === 'gpu' ? state.owner[b] : state.cpuOwner[b];
        const st = this.kind === 'gpu' ? state.blockState(b) : (owner >= 0 ? 'allocated' : 'free');
        const chosen = selectedBlocks.has(b);
        ctx.globalAlpha = sel && !chosen && st !== 'free' ? 0.45 : 1;   // a selection dims the others
        ctx.fillStyle = this.fill(state, st, owner);
        ctx.fillRect(x + gap, y + gap, c - 2 * gap, c - 2 * gap);
        if (st === 'cached' && c >= 8) {
          ctx.fillStyle = COLORS.cachedMark;
          ctx.fillRect(x + gap, y + c - gap - 2, c - 2 * gap, 2);
        } else if (this.kind === 'gpu' && state.cached[b] && c >= 8) {   // allocated and findable by its hash
          ctx.fillStyle = COLORS.cachedMark;
          ctx.beginPath(); ctx.moveTo(x + c - gap - 5, y + gap); ctx.lineTo(x + c - gap, y + gap);
          ctx.lineTo(x + c - gap, y + gap + 5); ctx.fill();
        }
        if (st === 'shared') {
          ctx.strokeStyle = '#fff';
          ctx.lineWidth = 1;
          ctx.strokeRect(x + gap + 0.5, y + gap + 0.5, c - 2 * gap - 1, c - 2 * gap - 1);
          if (c >= 13) { ctx.fillStyle = '#0b0d12'; ctx.fillText(String(state.ref[b]), x + c / 2, y + c / 2 + 0.5); }
        }
        ctx.globalAlpha = 1;
        const mark = hl.get(b);
        if (mark || chosen) {
          ctx.strokeStyle = chosen ? COLORS.select : COLORS[mark];
          ctx.lineWidth = 2;
          ctx.strokeRect(x + 1, y + 1, c - 2, c - 2);
        }
      }
      if (this.minimap) this.drawMinimap(state, n, width, hl);
    }

    drawGap(ctx, it, c) {
      const r = Math.min(6, c / 2 - 1);
      ctx.fillStyle = COLORS.gap;
      ctx.strokeStyle = '#2f3750';
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.roundRect ? ctx.roundRect(it.x + 1.5, it.y + 1.5, it.w - 3, c - 3, r) : ctx.rect(it.x + 1.5, it.y + 1.5, it.w - 3, c - 3);
      ctx.fill(); ctx.stroke();
      const label = `free ×${(it.b1 - it.b0 + 1).toLocaleString('en-US')}`;
      if (ctx.measureText(label).width < it.w - 6) {
        ctx.fillStyle = COLORS.gapText;
        ctx.fillText(label, it.x + it.w / 2, it.y + c / 2 + 0.5);
      }
    }

    // The whole pool in one strip: each pixel column the brightest thing of its blocks.
    drawMinimap(state, n, width, hl) {
      const mm = this.minimap, dpr = window.devicePixelRatio || 1, h = 12;
      if (mm.width !== Math.round(width * dpr)) { mm.width = Math.round(width * dpr); mm.height = Math.round(h * dpr); }
      mm.style.height = h + 'px';
      const ctx = mm.getContext('2d');
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.fillStyle = COLORS.minimapFree;
      ctx.fillRect(0, 0, width, h);
      if (!n) return;
      const per = n / width;
      for (let x = 0; x < width; x++) {
        let best = null, rank = 0;
        for (let b = Math.floor(x * per); b < Math.min(n, Math.max(Math.floor(x * per) + 1, Math.floor((x + 1) * per))); b++) {
          const st = state.blockState(b), r = hl.has(b) ? 4 : st === 'shared' ? 3 : st === 'allocated' ? 2 : st === 'cached' ? 1 : 0;
          if (r > rank) { rank = r; best = b; }
        }
        if (best === null) continue;
        ctx.fillStyle = rank === 4 ? COLORS[hl.get(best)] : this.fill(state, state.blockState(best), state.owner[best]);
        ctx.fillRect(x, rank >= 2 ? 0 : 6, 1, rank >= 2 ? h : h - 6);
      }
      mm.title = `the whole pool, ${n} blocks, about ${per.toFixed(1)} per pixel: bright = allocated, dim = cached`;
    }

    fill(state, st, owner) {
      if (st === 'free' || owner < 0) return COLORS.free;
      const h = PC.requestHue(state.requestNames.get(owner) ?? owner);
      if (st === 'cached') return `hsl(${h},30%,30%)`;
      return `hsl(${h},70%,${st === 'shared' ? 68 : 58}%)`;
    }

    // block -> 'allocated' | 'hit' | 'cow' | 'freed' for what the last record did to this pool
    highlights(rec) {
      const m = new Map();
      if (!rec || !rec.events) return m;
      const ev = rec.events;
      if (this.kind === 'gpu') {
        for (const [b, , ref] of ev.freed || []) if (ref === 0) m.set(b, 'freed');
        for (const [b] of ev.allocated || []) m.set(b, 'allocated');
        for (const [b] of ev.prefix_hits || []) m.set(b, 'hit');
        for (const [, dst] of ev.cow || []) m.set(dst, 'cow');
        for (const [, g] of ev.swapped_in || []) m.set(g, 'allocated');
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

    // Where block b is drawn, in CSS pixels of the canvas (for the tests and the block table's links).
    cellRect(b) { return this.layout ? this.layout.rectOf(b) : null; }

    itemAt(e) {
      if (!this.layout || !this.state) return null;
      const r = this.canvas.getBoundingClientRect();
      return this.layout.itemAt(e.clientX - r.left, e.clientY - r.top);
    }

    hover(e) {
      const it = this.itemAt(e);
      if (!it) { this.tooltip.hidden = true; return; }
      this.tooltip.textContent = it.gap ? this.describeRun(it) : this.describe(it.b0);
      this.tooltip.style.left = e.clientX + 14 + 'px';
      this.tooltip.style.top = e.clientY + 10 + 'px';
      this.tooltip.hidden = false;
    }

    describeRun(it) {
      const what = this.kind === 'gpu' ? 'free blocks, no hash: nothing in them to reuse' : 'free CPU blocks';
      return `blocks ${it.b0}–${it.b1}: ${it.b1 - it.b0 + 1} ${what}\n(folded so that the blocks in use stay readable)`;
    }

    describe(b) {
      const s = this.state, name = (sid) => `seq ${sid} (${s.requestNames.get(sid) ?? '?'})`;
      if (this.kind === 'cpu') {
        const o = s.cpuOwner[b];
        return o < 0 ? `CPU block ${b}: free` : `CPU block ${b}: swapped-out KV of ${name(o)}`;
      }
      const st = s.blockState(b), lines = [`block ${b}: ${st}  ref_count ${s.ref[b]}`];
      const holders = s.holders().get(b) || [];
      if (holders.length) lines.push(`owner sequences (${holders.length}):`);
      for (const [sid, i] of holders.slice(0, 12)) {
        const seq = s.seqs.get(sid);
        lines.push(`  ${name(sid)}, logical block ${i}` + (seq && seq.lora_name ? `, adapter ${seq.lora_name}` : ''));
      }
      if (holders.length > 12) lines.push(`  … ${holders.length - 12} more`);
      lines.push(s.cached[b] ? (st === 'cached' ? 'prefix cache: free, but its hash still finds it; a prefix hit revives it'
        : 'prefix cache: yes (full block, found by its hash)') : 'prefix cache: no');
      if (s.owner[b] >= 0) lines.push(`computed by ${name(s.owner[b])}`);
      return lines.join('\n');
    }
  }

  PC.BlockGrid = BlockGrid;
  PC.GRID_COLORS = COLORS;
})(window.PC);
