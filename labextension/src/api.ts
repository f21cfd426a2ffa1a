/** The REST API of the mlms-nb server extension ({baseUrl}mlms/api/...), with Jupyter's token and XSRF. */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface ITraceFacts {
  framework: string;
  spans: number;
  trace_level: string;
  source: string;
  /** Why this trace cannot be read (a damaged file, a link out of its folder); absent when it can. */
  unreadable?: string;
}

export interface IRun {
  evaluation_id: string;
  model: string;
  model_version: string;
  created_at: string;
  complete: boolean;
  dataset: string | null;
  frameworks: string[];
  batch_sizes: number[];
  history_ids: number[];
  traces: ITraceFacts[];
  trace_levels: string[];
}

export interface IRunsReply {
  runs: IRun[];
  version: string;
  store: string;
  unchanged?: boolean;
}

export interface ITrack {
  track: number;
  label: string;
  level: string;
  device: string;
  thread: number;
  stream: number;
  depth: number;
}

export interface ISignatures {
  name: number[];
  shape: string[];
  layer_type: string[];
  kind: string[];
  level: string[];
  flops: (number | null)[];
  colour: string[];
}

export interface ITraceMeta {
  evaluation_id: string;
  framework: string;
  origin_ns: number;
  extent_ns: number;
  focus_ns: [number, number];
  n_spans: number;
  raw_level: number;
  resolution_ns: number[];
  tracks: ITrack[];
  names: string[];
  sigs: ISignatures;
  has_correlation: boolean;
  /** A generate run's steps, ns on the index clock (as the tiles), sorted by start; absent in older indexes. */
  phases?: IPhase[];
}

export interface IPhase {
  label: string;
  phase: string;
  step: number;
  batch_size: number;
  start_ns: number;
  end_ns: number;
}

export interface ITile {
  start: number[];
  end: number[];
  track: number[];
  sig: number[];
  n: number[];
  busy: number[];
  ref: number[];
  level: number;
  raw_level: number;
  ns_per_px: number;
  count: number;
}

export interface ISpanRef {
  ref: number;
  start_ns: number;
  end_ns: number;
  track: number;
  name: string;
  sig: number;
  relation?: string;
}

export interface ILinks {
  span: ISpanRef;
  related: ISpanRef[];
}

export interface ISummary {
  start_ns: number;
  end_ns: number;
  spans: number;
  names: number;
  rows: { name: string; count: number; total_ns: number; self_ns: number }[];
  note: string;
}

export interface ISearch {
  query: string;
  name_ids: number[];
  names: { name: string; count: number; total_ns: number }[];
  matches: number;
  first: ISpanRef[];
}

export interface ICounterSeries {
  label: string;
  source: string;
  unit: string;
  t_ns: number[];
  min: (number | null)[];
  max: (number | null)[];
  lo: number | null;
  hi: number | null;
}

export interface ICounters {
  series: ICounterSeries[];
  note: string;
}

/** GET {baseUrl}mlms/api/{path}?{query}; throws an Error carrying the server's one-sentence message. */
export async function requestAPI<T>(
  path: string,
  query: Record<string, string | number> = {},
  signal?: AbortSignal
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    params.set(k, String(v));
  }
  const qs = params.toString();
  const url = URLExt.join(settings.baseUrl, 'mlms', 'api', path) + (qs ? `?${qs}` : '');
  const response = await ServerConnection.makeRequest(url, { signal }, settings);
  const text = await response.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    throw new Error((data && data.message) || `${response.status} ${response.statusText}`);
  }
  return data as T;
}

export function tracePath(evaluationId: string, framework: string, what = ''): string {
  const base = `runs/${encodeURIComponent(evaluationId)}/traces/${encodeURIComponent(framework)}`;
  return what ? `${base}/${what}` : base;
}
