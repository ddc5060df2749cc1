/** What the panel says instead of or beside the charts: no-GPU and stale states, the process list. */

import { formatBytes } from './format';
import { IGpuProcess, ISnapshot } from './snapshot';

/** Why there are no GPU charts, or null when GPUs are being shown. */
export function noGpuMessage(s: ISnapshot): string | null {
  if (!s.nvml.available) {
    return `No GPU data: ${s.nvml.reason || 'NVML is not available'}.`;
  }
  if (s.gpus.length === 0) {
    return 'No GPU data: NVML found no GPU on this machine.';
  }
  return null;
}

/** A snapshot is stale when the sampler has not produced one for several intervals (hung driver). */
export function isStale(s: ISnapshot): boolean {
  const age = s.age_s ?? 0;
  return age > Math.max(5, 5 * s.interval_s);
}

/** One row of the process list. */
export interface IProcessRow {
  label: string;
  title: string;
  gpu: number;
  pid: number;
  memory: string;
  bytes: number;
  isKernel: boolean;
  rank: number | null;
}

/**
 * GPU processes: the ranks of a distributed job first, by rank (named by rank and node), then the
 * others, largest memory first, named after their notebook when a kernel owns them.
 */
export function processRows(procs: IGpuProcess[]): IProcessRow[] {
  return procs
    .map(p => {
      const nb = p.kernel?.notebook ?? null;
      const who = nb
        ? nb
        : p.kernel
          ? `kernel ${p.kernel.id.slice(0, 8)}`
          : p.visible === false
            ? `pid ${p.pid} (not visible here)`
            : `${p.name ?? 'process'} (pid ${p.pid})`;
      const rank = p.rank ?? null;
      const localRank = p.local_rank ?? null;
      const label = rank === null ? who : `rank ${rank}${p.node ? ` · ${p.node}` : ''}`;
      const title = p.kernel?.path
        ? `${p.kernel.path} — kernel ${p.kernel.name ?? ''} (pid ${p.pid})`
        : rank === null
          ? label
          : `${label} — ${who}${localRank !== null ? `, local rank ${localRank}` : ''}`;
      return {
        label,
        title,
        gpu: p.gpu_index,
        pid: p.pid,
        memory: formatBytes(p.used_memory_bytes),
        bytes: p.used_memory_bytes ?? 0,
        isKernel: p.kernel !== null,
        rank
      };
    })
    .sort((a, b) => byRank(a.rank, b.rank) || b.bytes - a.bytes || a.gpu - b.gpu || a.pid - b.pid);
}

/** Ranked before unranked, then by rank. */
function byRank(a: number | null, b: number | null): number {
  if (a === null || b === null) {
    return (a === null ? 1 : 0) - (b === null ? 1 : 0);
  }
  return a - b;
}
