/**
 * The live feed: a WebSocket to `perfmagic/api/stream` that reconnects with exponential backoff,
 * and falls back to polling `perfmagic/api/snapshot` while the socket cannot be opened
 * (proxies that drop WebSockets are common in front of JupyterHub).
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { ISnapshot } from './snapshot';
import { backoffDelay, clampRate, isSnapshot } from './stream';

/** What the panel shows about the feed. */
export type FeedState = 'connecting' | 'live' | 'polling' | 'reconnecting' | 'paused' | 'error';

export interface IFeedOptions {
  onSnapshot: (s: ISnapshot) => void;
  onState: (state: FeedState, detail?: string) => void;
  rateHz: number;
  serverSettings?: ServerConnection.ISettings;
}

/** Failed socket attempts in a row before polling the REST snapshot meanwhile. */
const POLL_AFTER_FAILURES = 2;

export class MonitorFeed {
  private readonly settings: ServerConnection.ISettings;
  private ws: WebSocket | null = null;
  private failures = 0;
  private paused = true;
  private disposed = false;
  private reconnectTimer: number | undefined;
  private pollTimer: number | undefined;
  /** Bumped by every start and stop: a poll of an earlier round neither shows nor schedules. */
  private pollRound = 0;
  private polling = false;
  private rateHz: number;

  constructor(private readonly options: IFeedOptions) {
    this.settings = options.serverSettings ?? ServerConnection.makeSettings();
    this.rateHz = clampRate(options.rateHz);
  }

  /** Start or resume updates. */
  resume(): void {
    if (this.disposed || !this.paused) {
      return;
    }
    this.paused = false;
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.send({ pause: false, rate: this.rateHz });
      this.options.onState('live');
    } else if (!this.ws) {
      this.failures = 0;
      this.connect();
    } // else still connecting: onopen goes live
  }

  /** Stop updates (hidden panel); the socket stays open but the server stops sending. */
  pause(): void {
    if (this.paused) {
      return;
    }
    this.paused = true;
    this.send({ pause: true });
    this.stopPolling();
    window.clearTimeout(this.reconnectTimer);
    this.options.onState('paused');
  }

  setRate(hz: number): void {
    this.rateHz = clampRate(hz);
    this.send({ rate: this.rateHz });
    if (this.polling) {
      this.startPolling();
    }
  }

  dispose(): void {
    this.disposed = true;
    this.paused = true;
    window.clearTimeout(this.reconnectTimer);
    this.stopPolling();
    const ws = this.ws;
    this.ws = null;
    ws?.close();
  }

  private url(path: string): string {
    return URLExt.join(this.settings.baseUrl, 'perfmagic/api', path);
  }

  private connect(): void {
    window.clearTimeout(this.reconnectTimer);
    if (this.disposed || this.paused) {
      return;
    }
    const previous = this.ws;
    this.ws = null;
    previous?.close();
    this.options.onState(this.failures ? 'reconnecting' : 'connecting');
    let url = URLExt.join(this.settings.wsUrl, 'perfmagic/api/stream') + `?rate=${this.rateHz}`;
    const token = this.settings.token;
    if (this.settings.appendToken && token) {
      url += `&token=${encodeURIComponent(token)}`;
    }
    let ws: WebSocket;
    try {
      ws = new this.settings.WebSocket(url);
    } catch (e) {
      this.scheduleReconnect();
      return;
    }
    this.ws = ws;
    ws.onopen = () => {
      if (this.paused) {
        this.send({ pause: true });
      }
    };
    ws.onmessage = event => {
      if (this.ws !== ws) {
        return;
      }
      let msg: unknown;
      try {
        msg = JSON.parse(event.data as string);
      } catch {
        return;
      }
      if (isSnapshot(msg) && !this.paused) {
        // Only data proves the socket works: some proxies accept the upgrade, then drop it.
        if (this.failures || this.polling) {
          this.failures = 0;
          this.stopPolling();
        }
        this.options.onState('live');
        this.options.onSnapshot(msg);
      }
    };
    ws.onclose = () => {
      if (this.ws !== ws) {
        return; // a socket we already replaced or disposed
      }
      this.ws = null;
      this.scheduleReconnect();
    };
  }

  private scheduleReconnect(): void {
    if (this.disposed || this.paused) {
      return;
    }
    this.failures++;
    if (this.failures >= POLL_AFTER_FAILURES && !this.polling) {
      this.startPolling();
    }
    if (!this.polling) {
      this.options.onState('reconnecting');
    }
    const delay = backoffDelay(this.failures - 1);
    this.reconnectTimer = window.setTimeout(() => this.connect(), delay);
  }

  private send(msg: object): void {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(msg));
    }
  }

  private startPolling(): void {
    this.stopPolling();
    this.polling = true;
    this.options.onState('polling');
    const round = this.pollRound;
    // Sequential, never setInterval: the next request goes out only after this one ended, so a slow
    // server never has several requests of one sidebar in flight.
    const poll = async (): Promise<void> => {
      const started = performance.now();
      try {
        const response = await ServerConnection.makeRequest(this.url('snapshot'), {}, this.settings);
        if (!response.ok) {
          throw new Error(`HTTP ${response.status}`);
        }
        const snap: unknown = await response.json();
        if (isSnapshot(snap) && !this.paused && round === this.pollRound) {
          this.options.onSnapshot(snap);
          this.options.onState('polling');
        }
      } catch (e) {
        if (round === this.pollRound) {
          this.options.onState('error', String(e));
        }
      }
      if (round === this.pollRound) {
        const wait = Math.max(0, 1000 / this.rateHz - (performance.now() - started));
        this.pollTimer = window.setTimeout(() => void poll(), wait);
      }
    };
    void poll();
  }

  private stopPolling(): void {
    this.pollRound++;
    this.polling = false;
    window.clearTimeout(this.pollTimer);
    this.pollTimer = undefined;
  }
}
