// Feed: where records come from (the live SSE stream, a trace file, a simulated run) and how fast
// they are applied (play, pause, single step, seek). The engine never waits for the page: while
// paused, live records queue here.
'use strict';

(function (PC) {
  class Feed {
    constructor(state, onChange, onStatus) {
      this.state = state;
      this.onChange = onChange;
      this.onStatus = onStatus;
      this.mode = 'idle';        // live | replay | idle
      this.playing = true;
      this.speed = 20;           // steps per second in replay; 0 = as recorded (wall-clock gaps)
      this.pending = [];         // live: received, not yet applied
      this.records = [];         // replay: the whole trace
      this.pos = 0;              // replay: index of the next record to apply
      this.source = null;
      this.credit = 0;
      this.lastTick = performance.now();
      this.pauseOn = { preempt: false, swap: false, hit: false, cow: false };   // "pause on" (explain.js pauseReason)
      this.pausedBy = null;      // {step, reason} of the last automatic pause
    }

    // Applies one record; false (and paused) when it holds an event the user asked to stop at.
    applyOne(rec) {
      this.state.apply(rec);
      const reason = PC.pauseReason(rec, this.pauseOn);
      if (!reason) return true;
      this.playing = false;
      this.pausedBy = { step: rec.step, reason };
      this.onStatus(`paused at step ${rec.step}: ${reason} — read “This step, explained”, then Play or Step`, 'paused');
      return false;
    }

    // -- sources ----------------------------------------------------------------------------------------
    connectLive() {
      this.close();
      this.mode = 'live';
      this.pending = [];
      this.playing = true;
      this.onStatus('connecting to the engine…', '');
      const es = new EventSource('/simulator/events');
      this.source = es;
      es.onmessage = (e) => {
        const rec = JSON.parse(e.data);
        if (rec.kind === 'unavailable') { this.onStatus(rec.message, 'error'); es.close(); this.mode = 'idle'; return; }
        if (rec.kind === 'loading') { this.onStatus('the model is loading…', ''); return; }
        if (rec.kind === 'snapshot') { this.pending = []; this.state.apply(rec); this.onChange(); }
        else this.pending.push(rec);
        if (this.pausedBy && !this.playing) {
          this.onStatus(`paused at step ${this.pausedBy.step}: ${this.pausedBy.reason} · ${this.pending.length} steps held`, 'paused');
        } else {
          this.onStatus(`live · step ${this.state.step}` + (this.pending.length && !this.playing ?
            ` (${this.pending.length} held)` : ''), 'live');
        }
      };
      es.onerror = () => { if (this.mode === 'live') this.onStatus('live stream lost; retrying…', 'error'); };
    }

    loadRecords(records, label) {
      if (!records.length || records[0].kind !== 'snapshot') {
        throw new Error('a trace starts with a snapshot line (kind "snapshot"); this file does not');
      }
      this.close();
      this.mode = 'replay';
      this.records = records;
      this.label = label;
      this.state.reset(records[0]);
      this.pos = 1;
      this.playing = false;
      this.onChange();
      this.status();
    }

    loadText(text, label) {
      const records = text.split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
      this.loadRecords(records, label);
    }

    close() {
      if (this.source) { this.source.close(); this.source = null; }
    }

    status() {
      if (this.mode !== 'replay') return;
      const steps = this.records.filter((r) => r.kind === 'step').length;
      this.onStatus(`replay · ${this.label} · record ${this.pos - 1} of ${this.records.length - 1}` +
        ` (step ${this.state.step}, ${steps} steps)`, '');
    }

    // -- controls ---------------------------------------------------------------------------------------
    play() { this.playing = true; this.pausedBy = null; this.lastTick = performance.now(); this.credit = 0; }
    pause() { this.playing = false; }

    // Applies records up to and including the next "step" record.
    stepOnce() {
      this.playing = false;
      const next = () => (this.mode === 'live' ? this.pending.shift() : this.records[this.pos++]);
      for (;;) {
        const rec = next();
        if (!rec) { if (this.mode === 'replay') this.pos = this.records.length; break; }
        this.state.apply(rec);
        if (rec.kind === 'step') break;
      }
      this.onChange();
      this.status();
    }

    toEnd() {
      if (this.mode === 'live') { for (const r of this.pending.splice(0)) this.state.apply(r); }
      else { while (this.pos < this.records.length) this.state.apply(this.records[this.pos++]); }
      this.onChange();
      this.status();
    }

    // Replay: back to the start, then forward to the record of `step` (records are absolute, so
    // rebuilding from the snapshot is exact and fast).
    seekStep(step) {
      if (this.mode !== 'replay') return;
      this.state.reset(this.records[0]);
      this.pos = 1;
      while (this.pos < this.records.length) {
        const r = this.records[this.pos];
        if (r.kind === 'step' && r.step > step) break;
        this.state.apply(r);
        this.pos++;
      }
      this.playing = false;
      this.onChange();
      this.status();
    }

    // Called once per animation frame: applies what the speed allows, and says whether anything changed.
    tick(now) {
      const dt = (now - this.lastTick) / 1000;
      this.lastTick = now;
      if (!this.playing) return false;
      if (this.mode === 'live') {
        if (!this.pending.length) return false;
        while (this.pending.length && this.applyOne(this.pending.shift()));
        if (!this.playing) return true;
        this.onStatus(`live · step ${this.state.step}`, 'live');
        return true;
      }
      if (this.mode !== 'replay' || this.pos >= this.records.length) return false;
      let changed = false;
      if (this.speed === 0) {          // as recorded: follow the trace's own clock
        this.replayClock = (this.replayClock || this.state.time) + dt;
        while (this.playing && this.pos < this.records.length && this.records[this.pos].time <= this.replayClock) {
          this.applyOne(this.records[this.pos++]);
          changed = true;
        }
      } else {
        this.credit = Math.min(this.credit + dt * this.speed, 1000);
        while (this.playing && this.credit >= 1 && this.pos < this.records.length) {
          const r = this.records[this.pos++];
          this.applyOne(r);
          if (r.kind === 'step') this.credit -= 1;
          changed = true;
        }
      }
      if (this.pos >= this.records.length) this.playing = false;
      if (changed && this.playing) this.status();
      return changed;
    }
  }

  PC.Feed = Feed;
})(window.PC);
