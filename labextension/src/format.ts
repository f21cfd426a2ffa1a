/** Numbers with their units, as the rest of mlms-nb prints them. */

/** A duration or time given in ns, in the unit that reads best: s, ms, µs or ns. */
export function fmtNs(ns: number, digits = 3): string {
  if (!isFinite(ns)) {
    return 'unknown';
  }
  const a = Math.abs(ns);
  if (a >= 1e9) {
    return `${(ns / 1e9).toFixed(digits)} s`;
  }
  if (a >= 1e6) {
    return `${(ns / 1e6).toFixed(digits)} ms`;
  }
  if (a >= 1e3) {
    return `${(ns / 1e3).toFixed(digits)} µs`;
  }
  return `${ns.toFixed(0)} ns`;
}

/** A tick label for a time in ms on an axis whose ticks are ``stepMs`` apart. */
export function fmtTick(ms: number, stepMs: number): string {
  const unit = stepMs >= 1000 ? [1000, 's'] : stepMs >= 1 ? [1, 'ms'] : stepMs >= 1e-3 ? [1e-3, 'µs'] : [1e-6, 'ns'];
  const [scale, name] = unit as [number, string];
  const step = stepMs / scale;
  const decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step) + 1e-9)));
  return `${(ms / scale).toFixed(decimals)} ${name}`;
}

export function fmtFlops(f: number | null): string {
  if (f === null || !isFinite(f)) {
    return 'unknown';
  }
  const units: [number, string][] = [
    [1e12, 'TFLOPs'],
    [1e9, 'GFLOPs'],
    [1e6, 'MFLOPs'],
    [1e3, 'kFLOPs']
  ];
  for (const [v, name] of units) {
    if (f >= v) {
      return `${(f / v).toFixed(3)} ${name}`;
    }
  }
  return `${f.toFixed(0)} FLOPs`;
}

export function fmtValue(v: number | null, unit: string): string {
  if (v === null || !isFinite(v)) {
    return 'unknown';
  }
  if (unit === 'bytes') {
    const units: [number, string][] = [
      [2 ** 30, 'GiB'],
      [2 ** 20, 'MiB'],
      [2 ** 10, 'KiB']
    ];
    for (const [s, name] of units) {
      if (Math.abs(v) >= s) {
        return `${(v / s).toFixed(1)} ${name}`;
      }
    }
    return `${v.toFixed(0)} bytes`;
  }
  return `${Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3)} ${unit}`;
}

/** "3 min ago" for an ISO-8601 time. */
export function fmtAgo(iso: string): string {
  const t = Date.parse(iso);
  if (isNaN(t)) {
    return iso;
  }
  const s = Math.max(0, (Date.now() - t) / 1000);
  if (s < 60) {
    return `${Math.round(s)} s ago`;
  }
  if (s < 3600) {
    return `${Math.round(s / 60)} min ago`;
  }
  if (s < 86400) {
    return `${Math.round(s / 3600)} h ago`;
  }
  return new Date(t).toISOString().slice(0, 16).replace('T', ' ') + ' UTC';
}

/** "nice" tick step (1, 2, 5 x 10^k) for about ``target`` ticks over ``span``. */
export function niceStep(span: number, target: number): number {
  const raw = span / Math.max(target, 1);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}
