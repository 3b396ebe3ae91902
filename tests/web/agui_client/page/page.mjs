// A page that uses the AG-UI protocol's own client: it runs the agent of the server that
// serves it (POST /run) on the thread and with the words its address gives (?thread=&say=),
// and renders the conversation as the client holds it, at every change (so a tool call's
// arguments and the answer's text show as they stream). Bundled for the browser by esbuild.
import { HttpAgent, randomUUID } from "@ag-ui/client";

const params = new URLSearchParams(location.search);
const list = document.getElementById("messages");
const body = document.body;
const seen = { TEXT_MESSAGE_CONTENT: 0, TOOL_CALL_ARGS: 0 };
let partialArguments = 0; // renders that showed a tool call's arguments before they were whole

function setState(state) {
  body.dataset.state = state;
  document.getElementById("state").textContent = state;
}

function element(tag, fields = {}, text = undefined) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(fields)) node.dataset[name] = value;
  if (text !== undefined) node.textContent = text;
  return node;
}

function render(messages) {
  list.replaceChildren(
    ...messages.map((message) => {
      const item = element("li", { id: message.id, role: message.role });
      item.append(element("span", { part: "role" }, message.role));
      item.querySelector("span").className = "role";
      const content = element("span", {}, typeof message.content === "string" ? message.content : "");
      content.className = "content";
      item.append(content);
      if (message.toolCallId) item.dataset.toolCallId = message.toolCallId;
      if (message.toolCalls?.length) {
        const calls = document.createElement("ul");
        calls.className = "calls";
        for (const call of message.toolCalls) {
          const arguments_ = call.function.arguments;
          try {
            JSON.parse(arguments_);
          } catch {
            partialArguments += 1;
          }
          const shown = element("li", { callId: call.id, name: call.function.name });
          shown.append(`${call.function.name}(`, element("code", {}, arguments_), ")");
          calls.append(shown);
        }
        item.append(calls);
      }
      return item;
    }),
  );
  body.dataset.partialArguments = String(partialArguments);
}

const agent = new HttpAgent({ url: "/run", threadId: params.get("thread") });
agent.subscribe({
  onMessagesChanged: ({ messages }) => render(messages),
  onEvent: ({ event }) => {
    if (event.type in seen) {
      seen[event.type] += 1;
      body.dataset[event.type === "TOOL_CALL_ARGS" ? "argumentDeltas" : "textDeltas"] = String(
        seen[event.type],
      );
    }
  },
});
agent.addMessage({ id: randomUUID(), role: "user", content: params.get("say") ?? "hello" });
render(agent.messages);
setState("running");
agent
  .runAgent()
  .then(() => {
    render(agent.messages);
    setState("done");
  })
  .catch((error) => {
    document.getElementById("problem").textContent = String(error?.stack ?? error);
    setState("failed");
  });
