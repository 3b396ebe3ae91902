// Helpers for the AG-UI client tests: a fetch that records (and validates) what the server
// sends and can cut the connection, and an HttpAgent that re-attaches with Last-Event-ID.
import {
  HttpAgent,
  randomUUID,
  runHttpRequest,
  transformHttpEventStream,
} from "@ag-ui/client";
import { EventSchemas } from "@ag-ui/core/schemas";

export const SERVER_A = process.env.AGUI_SERVER_A;
export const SERVER_B = process.env.AGUI_SERVER_B;

// What one or more streams carried: every event, the last SSE id, and any schema failures.
export function newRecord() {
  return { events: [], lastEventId: undefined, invalid: [], cut: false };
}

// A fetch for HttpAgent that tees the SSE body into `record`, validating each event against
// @ag-ui/core's schemas; when `cutAfter(event)` is true it ends the response there and aborts
// the connection, as a dropped Wi-Fi or a proxy's timeout would.
export function recordingFetch(record, { cutAfter } = {}) {
  return async (url, init = {}) => {
    const connection = new AbortController();
    init.signal?.addEventListener("abort", () => connection.abort());
    const response = await fetch(url, { ...init, signal: connection.signal });
    if (!response.ok || !response.body) return response;
    const decoder = new TextDecoder();
    const encoder = new TextEncoder();
    let buffer = "";
    const tee = new TransformStream({
      transform(chunk, out) {
        if (record.cut) return;
        buffer += decoder.decode(chunk, { stream: true });
        const blocks = buffer.split("\n\n");
        buffer = blocks.pop();
        for (const block of blocks) {
          const data = [];
          let id;
          for (const line of block.split("\n")) {
            if (line.startsWith("id:")) id = line.slice(3).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          out.enqueue(encoder.encode(`${block}\n\n`));
          if (data.length === 0) continue;
          const event = JSON.parse(data.join("\n"));
          const checked = EventSchemas.safeParse(event);
          if (!checked.success) record.invalid.push({ event, error: checked.error.message });
          record.events.push(event);
          if (id !== undefined) record.lastEventId = id;
          if (cutAfter?.(event)) {
            record.cut = true;
            out.terminate();
            connection.abort();
            return;
          }
        }
      },
    });
    return new Response(response.body.pipeThrough(tee), {
      status: response.status,
      headers: response.headers,
    });
  };
}

// HttpAgent with AG-UI's connect (re-attach): POST /connect, sending Last-Event-ID when it
// has one, so the server resumes right after the last event the client got.
export class ResumableAgent extends HttpAgent {
  constructor({ server, ...config }) {
    super({ url: `${server}/run`, ...config });
    this.connectUrl = `${server}/connect`;
    this.lastEventId = undefined;
  }

  connect(input) {
    const headers = { "Content-Type": "application/json", Accept: "text/event-stream" };
    if (this.lastEventId !== undefined) headers["Last-Event-ID"] = this.lastEventId;
    return transformHttpEventStream(
      runHttpRequest(() =>
        this.fetch(this.connectUrl, {
          method: "POST",
          headers,
          body: JSON.stringify(input),
          signal: this.abortController.signal,
        }),
      ),
    );
  }
}

export function newThread() {
  return `thread-${randomUUID()}`;
}

export function userMessage(content) {
  return { id: `user-${randomUUID()}`, role: "user", content };
}

// A fresh client's view of the thread: what a page opened now would show.
export async function hydrated(server, threadId) {
  const record = newRecord();
  const agent = new ResumableAgent({ server, threadId, fetch: recordingFetch(record) });
  await agent.connectAgent();
  return { messages: agent.messages, state: agent.state, record };
}

// Messages as the comparison needs them: the fields a client reassembles.
export function comparable(messages) {
  return messages.map(({ id, role, content, toolCalls, toolCallId }) => ({
    id,
    role,
    content: content ?? undefined,
    toolCalls: toolCalls?.length ? toolCalls : undefined,
    toolCallId,
  }));
}

export function waitFor(condition, what, timeout = 20000) {
  const deadline = Date.now() + timeout;
  return new Promise((resolve, reject) => {
    const check = () => {
      if (condition()) resolve();
      else if (Date.now() > deadline) reject(new Error(`timed out waiting for ${what}`));
      else setTimeout(check, 10);
    };
    check();
  });
}
