/**
 * The feed's pure parts: the refresh rates the server serves, which stream messages are
 * snapshots, and the reconnect delay.
 */

import { ISnapshot } from './snapshot';

export const MIN_RATE_HZ = 0.25;
export const MAX_RATE_HZ = 10;

/** A refresh rate as the server will serve it. */
export function clampRate(hz: number): number {
  if (!Number.isFinite(hz)) {
    return 1;
  }
  return Math.min(MAX_RATE_HZ, Math.max(MIN_RATE_HZ, hz));
}

/** Whether a message from the stream is a snapshot (the server also sends config acks). */
export function isSnapshot(msg: unknown): msg is ISnapshot {
  return (
    typeof msg === 'object' && msg !== null && (msg as { schema?: unknown }).schema === 'perfmagic.snapshot/1'
  );
}

/**
 * Reconnect delay after `attempt` consecutive failures: exponential from `baseMs`, capped at
 * `maxMs`, with up to ±`jitter` randomness so many tabs don't reconnect in lockstep.
 */
export function backoffDelay(
  attempt: number,
  baseMs = 500,
  maxMs = 30000,
  jitter = 0.2,
  random: () => number = Math.random
): number {
  const raw = Math.min(maxMs, baseMs * 2 ** Math.max(0, attempt));
  const spread = raw * jitter * (2 * random() - 1);
  return Math.max(0, Math.round(Math.min(maxMs, raw + spread)));
}
