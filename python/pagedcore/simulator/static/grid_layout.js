// gridLayout: where each block of a pool is drawn, so that a pool of any size reads on one screen.
//
//   small pool (cells of >= 14 px fit):   one cell per block, in block-id order
//   large pool, mostly free:              runs of free blocks folded into pills, the rest as cells
//       [B0][B1][B2][ free ×812 ][B815][B816][   free ×4,990   ][B5807]…
//   large pool, busy (nothing to fold):   one small cell per block (the pool is then full of colour)
//
// Items keep block-id order, so a request's blocks sit where the pool put them. Returns
// {cell, height, folded, items: [{b0, b1, gap, x, y, w}], rectOf(b), itemAt(x, y)} in CSS pixels.
'use strict';

(function (PC) {
  const GOOD_CELL = 14;         // a whole pool at this size or more reads as it is: no folding
  const MIN_FULL_CELL = 10;     // below this a block's colour and its ref count stop reading
  const MIN_FOLDED_CELL = 9;
  const MAX_CELL = 28;

  function gridLayout(n, width, maxHeight, busy) {
    let fullCell = 0;
    for (let c = MAX_CELL; c >= MIN_FULL_CELL && !fullCell; c--) {
      if (Math.ceil(n / Math.max(1, Math.floor(width / c))) * c <= maxHeight) fullCell = c;
    }
    if (fullCell >= GOOD_CELL) return full(n, width, fullCell);
    // Folding pays when it gives the blocks in use bigger cells than the whole pool can have.
    const runs = freeRuns(n, busy);
    for (let c = 20; c > Math.max(fullCell, MIN_FOLDED_CELL - 1); c--) {
      const L = folded(n, width, c, runs);
      if (L.height <= maxHeight) return L;
    }
    if (fullCell) return full(n, width, fullCell);
    // Too busy to fold into the height: the dense grid, as small as it must be (>= 2 px).
    let c = MIN_FULL_CELL - 1;
    while (c > 2 && Math.ceil(n / Math.max(1, Math.floor(width / c))) * c > maxHeight) c--;
    return full(n, width, c);
  }

  // [start, end] of every maximal run of blocks that hold nothing, in order.
  function freeRuns(n, busy) {
    const runs = [];
    let start = -1;
    for (let b = 0; b <= n; b++) {
      const free = b < n && !busy(b);
      if (free && start < 0) start = b;
      if (!free && start >= 0) { runs.push([start, b - 1]); start = -1; }
    }
    return runs;
  }

  function full(n, width, c) {
    const cols = Math.max(1, Math.floor(width / c));
    const items = [];
    for (let b = 0; b < n; b++) items.push({ b0: b, b1: b, gap: false, x: (b % cols) * c, y: Math.floor(b / cols) * c, w: c });
    return finish({ cell: c, cols, folded: false, items, height: n ? Math.ceil(n / cols) * c : 0 });
  }

  function folded(n, width, c, runs) {
    const cols = Math.max(1, Math.floor(width / c));
    const pill = (len) => Math.min(cols, len >= 1000 ? 6 : len >= 100 ? 5 : 4);   // cells a folded run takes
    const items = [];
    let col = 0, row = 0, r = 0;
    const place = (b0, b1, gap, span) => {
      if (col + span > cols) { col = 0; row++; }
      items.push({ b0, b1, gap, x: col * c, y: row * c, w: span * c });
      col += span;
    };
    for (let b = 0; b < n;) {
      if (r < runs.length && runs[r][0] === b) {
        const [s, e] = runs[r++];
        const len = e - s + 1;
        if (len > pill(len)) { place(s, e, true, pill(len)); b = e + 1; continue; }
        for (let x = s; x <= e; x++) place(x, x, false, 1);
        b = e + 1;
        continue;
      }
      place(b, b, false, 1);
      b++;
    }
    return finish({ cell: c, cols, folded: true, items, height: items.length ? (row + 1) * c : 0 });
  }

  function finish(L) {
    const rowStart = [];               // first item index of each row
    L.items.forEach((it, i) => { const row = Math.round(it.y / L.cell); if (rowStart[row] === undefined) rowStart[row] = i; });
    L.rectOf = (b) => {
      let lo = 0, hi = L.items.length - 1;
      while (lo <= hi) {
        const mid = (lo + hi) >> 1, it = L.items[mid];
        if (b < it.b0) hi = mid - 1; else if (b > it.b1) lo = mid + 1;
        else return { x: it.x, y: it.y, w: it.w, h: L.cell, gap: it.gap };
      }
      return null;
    };
    L.itemAt = (x, y) => {
      const row = Math.floor(y / L.cell);
      if (row < 0 || rowStart[row] === undefined) return null;
      for (let i = rowStart[row]; i < L.items.length && Math.round(L.items[i].y / L.cell) === row; i++) {
        const it = L.items[i];
        if (x >= it.x && x < it.x + it.w) return it;
      }
      return null;
    };
    return L;
  }

  PC.gridLayout = gridLayout;
})(window.PC);
