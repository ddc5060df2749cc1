/** Values in the report's units (bytes, watts, °C, fractions in [0, 1]) as the sidebar prints them. */

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function formatBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !Number.isFinite(n)) {
    return '–';
  }
  let i = 0;
  let v = Math.abs(n);
  while (v >= 1024 && i < BYTE_UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  const digits = i === 0 || v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return `${n < 0 ? '-' : ''}${v.toFixed(digits)} ${BYTE_UNITS[i]}`;
}

export function formatPercent(f: number | null | undefined): string {
  return f === null || f === undefined || !Number.isFinite(f) ? '–' : `${Math.round(f * 100)}%`;
}

export function formatWatts(w: number | null | undefined, limit?: number | null): string {
  if (w === null || w === undefined || !Number.isFinite(w)) {
    return '–';
  }
  return limit ? `${Math.round(w)} / ${Math.round(limit)} W` : `${Math.round(w)} W`;
}

/** Joules as "1.42 J", "850 J", "12.3 kJ", "4.10 MJ"; '–' where unknown. */
export function formatJoules(j: number | null | undefined): string {
  if (j === null || j === undefined || !Number.isFinite(j)) {
    return '–';
  }
  for (const [unit, scale] of [
    ['MJ', 1e6],
    ['kJ', 1e3]
  ] as const) {
    if (Math.abs(j) >= scale) {
      return `${(j / scale).toPrecision(3)} ${unit}`;
    }
  }
  return Math.abs(j) >= 100 ? `${Math.round(j)} J` : `${j.toPrecision(3)} J`;
}

export function formatCelsius(c: number | null | undefined): string {
  return c === null || c === undefined || !Number.isFinite(c) ? '–' : `${Math.round(c)} °C`;
}
