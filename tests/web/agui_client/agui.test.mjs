// nous_session.web judged by the AG-UI protocol's own client (see tests/web/test_agui_client.py).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import {
  ResumableAgent,
  SERVER_A,
  SERVER_B,
  comparable,
  hydrated,
  newRecord,
  newThread,
  recordingFetch,
  userMessage,
  waitFor,
} from "./helpers.mjs";

assert.ok(SERVER_A && SERVER_B, "AGUI_SERVER_A and AGUI_SERVER_B name the servers");

// Erase a thread's messages of one role through the library's command line, as an operator
// would (AGUI_PYTHON and AGUI_STORE name the interpreter and the servers' store).
function erase(threadId, role) {
  execFileSync(
    process.env.AGUI_PYTHON,
    ["-m", "nous_session", "--store", process.env.AGUI_STORE, "erase", threadId, "--role", role,
      "--reason", "asked to", "--yes"],
    { stdio: "pipe" },
  );
}

function assertValid(record) {
  assert.deepEqual(record.invalid, [], "every event validates against @ag-ui/core's schemas");
}

function assertNoDuplicates(messages) {
  const ids = messages.map((message) => message.id);
  assert.equal(new Set(ids).size, ids.length, `duplicate message ids: ${ids}`);
}

test("HttpAgent runs an agent: tool call, result and answer; the conversation is the server's", async () => {
  const threadId = newThread();
  const record = newRecord();
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(record) });
  agent.addMessage(userMessage("hello"));
  await agent.runAgent();
  assertValid(record);
  const types = record.events.map((event) => event.type);
  assert.equal(types[0], "RUN_STARTED");
  assert.equal(types.at(-1), "RUN_FINISHED");
  assert.ok(types.includes("STATE_SNAPSHOT"));
  assert.deepEqual(
    agent.messages.map((message) => message.role),
    ["user", "assistant", "tool", "assistant"],
  );
  assert.equal(agent.messages[1].toolCalls[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(agent.messages[1].toolCalls[0].function.arguments), {
    city: "Paris",
    units: "metric",
  });
  assert.equal(agent.messages[3].content, "You said: hello");
  assert.deepEqual(agent.state, { title: "hello" });
  // Reload after the run finished: a fresh page gets the same conversation, from either server.
  for (const server of [SERVER_A, SERVER_B]) {
    const page = await hydrated(server, threadId);
    assertValid(page.record);
    assert.deepEqual(comparable(page.messages), comparable(agent.messages));
    assert.deepEqual(page.state, { title: "hello" });
  }
});

test("a connection cut mid-run resumes with Last-Event-ID: no gap, no duplicate", async () => {
  const threadId = newThread();
  const record = newRecord();
  const cutting = recordingFetch(record, { cutAfter: (event) => event.type === "TOOL_CALL_END" });
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: cutting });
  agent.addMessage(userMessage("slow: what is the weather?"));
  await agent.runAgent().catch(() => {});
  assert.ok(record.cut, "the stream was cut");
  assert.ok(!record.events.some((event) => event.type === "RUN_FINISHED"), "cut before the end");
  const resumed = newRecord();
  agent.fetch = recordingFetch(resumed);
  agent.lastEventId = record.lastEventId;
  await agent.connectAgent();
  assertValid(record);
  assertValid(resumed);
  const types = resumed.events.map((event) => event.type);
  assert.equal(types[0], "RUN_STARTED");
  assert.equal(resumed.events[0].runId, record.events[0].runId, "the same run, re-attached");
  assert.ok(!types.includes("MESSAGES_SNAPSHOT"), "a resume sends what followed, not a snapshot");
  assert.ok(!types.includes("TOOL_CALL_START"), "nothing the client had is sent again");
  assert.equal(types.at(-1), "RUN_FINISHED");
  assertNoDuplicates(agent.messages);
  assert.deepEqual(comparable(agent.messages), comparable((await hydrated(SERVER_A, threadId)).messages));
});

test("two clients on one thread see the same conversation", async () => {
  const threadId = newThread();
  const runner = newRecord();
  const first = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(runner) });
  first.addMessage(userMessage("slow: two of us"));
  const run = first.runAgent();
  await waitFor(() => runner.events.length > 0, "the run to start");
  const watcher = newRecord();
  const second = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(watcher) });
  await second.connectAgent();
  await run;
  assertValid(runner);
  assertValid(watcher);
  assert.equal(watcher.events.at(-1).type, "RUN_FINISHED", "the watcher followed the run to its end");
  assertNoDuplicates(second.messages);
  assert.deepEqual(comparable(second.messages), comparable(first.messages));
  assert.equal(second.messages.at(-1).content, "You said: slow: two of us");
});

test("a client that resends its whole history appends nothing twice", async () => {
  const threadId = newThread();
  const record = newRecord();
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(record) });
  agent.addMessage(userMessage("first"));
  await agent.runAgent();
  agent.addMessage(userMessage("second"));
  await agent.runAgent(); // sends all six messages it holds
  await agent.runAgent(); // and again, with nothing new
  assertValid(record);
  const page = await hydrated(SERVER_A, threadId);
  assertNoDuplicates(page.messages);
  assert.deepEqual(
    page.messages.filter((message) => message.role === "user").map((message) => message.content),
    ["first", "second"],
  );
  // Three runs, three answers (tool call, result, answer) after two user messages.
  assert.equal(page.messages.length, 11);
  assert.deepEqual(comparable(page.messages), comparable(agent.messages));
});

test("a run cut on one server process resumes on another serving the same store", async () => {
  const threadId = newThread();
  const record = newRecord();
  const cutting = recordingFetch(record, { cutAfter: (event) => event.type === "TOOL_CALL_END" });
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: cutting });
  agent.addMessage(userMessage("slow: across workers"));
  await agent.runAgent().catch(() => {});
  assert.ok(record.cut);
  const resumed = newRecord();
  const elsewhere = new ResumableAgent({
    server: SERVER_B,
    threadId,
    initialMessages: agent.messages,
    fetch: recordingFetch(resumed),
  });
  elsewhere.lastEventId = record.lastEventId;
  await elsewhere.connectAgent();
  assertValid(resumed);
  assert.equal(resumed.events[0].runId, record.events[0].runId);
  assert.equal(resumed.events.at(-1).type, "RUN_FINISHED");
  assertNoDuplicates(elsewhere.messages);
  assert.equal(elsewhere.messages.at(-1).content, "You said: slow: across workers");
  assert.deepEqual(
    comparable(elsewhere.messages),
    comparable((await hydrated(SERVER_B, threadId)).messages),
  );
});

test("an answer streams word by word as live text, and is kept once, whole", async () => {
  const threadId = newThread();
  const record = newRecord();
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(record) });
  agent.addMessage(userMessage("slow: say it word by word"));
  await agent.runAgent();
  assertValid(record);
  const answer = agent.messages.at(-1);
  assert.equal(answer.content, "You said: slow: say it word by word");
  const deltas = record.events.filter(
    (event) => event.type === "TEXT_MESSAGE_CONTENT" && event.messageId === answer.id,
  );
  assert.ok(deltas.length > 1, `the answer came in ${deltas.length} delta(s)`);
  const page = await hydrated(SERVER_B, threadId);
  assertNoDuplicates(page.messages);
  assert.deepEqual(comparable(page.messages), comparable(agent.messages));
});

test("a connection cut in the middle of a live answer resumes to the whole answer", async () => {
  const threadId = newThread();
  const record = newRecord();
  const cutting = recordingFetch(record, {
    cutAfter: (event) => event.type === "TEXT_MESSAGE_CONTENT" && event.delta.includes("said"),
  });
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: cutting });
  agent.addMessage(userMessage("slow: cut me off mid-sentence please"));
  await agent.runAgent().catch(() => {});
  assert.ok(record.cut);
  const resumed = newRecord();
  agent.fetch = recordingFetch(resumed);
  agent.lastEventId = record.lastEventId;
  await agent.connectAgent();
  assertValid(resumed);
  assert.equal(resumed.events.at(-1).type, "RUN_FINISHED");
  assertNoDuplicates(agent.messages);
  assert.equal(agent.messages.at(-1).content, "You said: slow: cut me off mid-sentence please");
  assert.deepEqual(comparable(agent.messages), comparable((await hydrated(SERVER_A, threadId)).messages));
});

// The deltas of one tool call's arguments in a stream, in order.
function argumentDeltas(record, toolCallId) {
  return record.events
    .filter((event) => event.type === "TOOL_CALL_ARGS" && event.toolCallId === toolCallId)
    .map((event) => event.delta);
}

test("a tool call's arguments stream live and reassemble into what the log stores", async () => {
  const threadId = newThread();
  const record = newRecord();
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(record) });
  agent.addMessage(userMessage("slow: stream the arguments"));
  await agent.runAgent();
  assertValid(record);
  const call = agent.messages[1].toolCalls[0];
  const deltas = argumentDeltas(record, call.id);
  assert.ok(deltas.length > 1, `the arguments came in ${deltas.length} delta(s)`);
  // Each event once, in order: start, the deltas, end (before the call's message is kept).
  const ofCall = record.events.filter((event) => event.toolCallId === call.id);
  assert.deepEqual(
    ofCall.map((event) => event.type),
    ["TOOL_CALL_START", ...deltas.map(() => "TOOL_CALL_ARGS"), "TOOL_CALL_END", "TOOL_CALL_RESULT"],
  );
  assert.equal(ofCall[0].parentMessageId, agent.messages[1].id);
  // What the log keeps (a fresh page's snapshot carries the stored string) is what streamed.
  const page = await hydrated(SERVER_B, threadId);
  const stored = page.messages[1].toolCalls[0];
  assert.equal(stored.id, call.id);
  assert.equal(deltas.join(""), stored.function.arguments);
  assert.equal(call.function.arguments, stored.function.arguments);
  assert.deepEqual(JSON.parse(stored.function.arguments), { city: "Paris", units: "metric" });
  assertNoDuplicates(page.messages);
  assert.deepEqual(comparable(page.messages), comparable(agent.messages));
});

test("a connection cut in the middle of a tool call resumes to the whole call", async () => {
  const threadId = newThread();
  const record = newRecord();
  const cutting = recordingFetch(record, {
    cutAfter: (event) => event.type === "TOOL_CALL_ARGS" && event.delta.includes("Par"),
  });
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: cutting });
  agent.addMessage(userMessage("slow: cut me off mid-call"));
  await agent.runAgent().catch(() => {});
  assert.ok(record.cut);
  assert.ok(!record.events.some((event) => event.type === "TOOL_CALL_END"), "cut before its end");
  const partial = agent.messages.find((message) => message.toolCalls?.length);
  assert.ok(partial, "the client holds part of the call");
  const callId = partial.toolCalls[0].id;
  assert.notEqual(partial.toolCalls[0].function.arguments, "");
  const resumed = newRecord();
  agent.fetch = recordingFetch(resumed);
  agent.lastEventId = record.lastEventId;
  await agent.connectAgent();
  assertValid(resumed);
  const types = resumed.events.map((event) => event.type);
  // The call was still being generated: a snapshot drops the client's partial copy, then the
  // call is shown from its start, so its arguments are whole once (not appended twice).
  const snapshot = types.indexOf("MESSAGES_SNAPSHOT");
  const start = resumed.events.findIndex(
    (event) => event.type === "TOOL_CALL_START" && event.toolCallId === callId,
  );
  assert.ok(snapshot >= 0 && start > snapshot, `a snapshot, then the call again: ${types}`);
  assert.ok(
    !resumed.events[snapshot].messages.some((message) => message.toolCalls?.length),
    "the snapshot holds no partial call",
  );
  assert.equal(argumentDeltas(resumed, callId).join(""), '{"city": "Paris", "units": "metric"}');
  assert.equal(types.at(-1), "RUN_FINISHED");
  assertNoDuplicates(agent.messages);
  const page = await hydrated(SERVER_A, threadId);
  assert.deepEqual(comparable(agent.messages), comparable(page.messages));
  assert.equal(
    agent.messages.find((message) => message.toolCalls?.length).toolCalls[0].function.arguments,
    page.messages[1].toolCalls[0].function.arguments,
  );
});

test("an erasure reaches the client: re-attaching replaces the erased text on screen", async () => {
  const threadId = newThread();
  const record = newRecord();
  const agent = new ResumableAgent({ server: SERVER_A, threadId, fetch: recordingFetch(record) });
  const secret = `SECRET-${Date.now()}`;
  agent.addMessage(userMessage(`my secret is ${secret}`));
  await agent.runAgent();
  assert.ok(JSON.stringify(agent.messages).includes(secret), "on screen before the erasure");
  // An operator erases what was said, from the command line, while the page is open.
  for (const role of ["user", "assistant"]) {
    erase(threadId, role);
  }
  const resumed = newRecord();
  agent.fetch = recordingFetch(resumed);
  agent.lastEventId = record.lastEventId;
  await agent.connectAgent();
  assertValid(resumed);
  const erasures = resumed.events.filter(
    (event) => event.type === "CUSTOM" && event.name === "nous_session.erasure",
  );
  assert.equal(erasures.length, 2, "one redaction per erasure");
  assert.ok(erasures.every((event) => event.value.seqs.length > 0));
  assert.ok(!JSON.stringify(agent.messages).includes(secret), "gone from the client's messages");
  assert.ok(agent.messages.some((message) => message.content === "[erased]"));
  for (const server of [SERVER_A, SERVER_B]) {
    const page = await hydrated(server, threadId);
    assertValid(page.record);
    assert.ok(!JSON.stringify(page.messages).includes(secret), "a fresh page never shows it");
  }
});
