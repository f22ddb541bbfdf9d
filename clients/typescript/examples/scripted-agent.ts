// A tool-call loop without a model: the capabilities capstan exposes on the
// "mcp" surface become AI SDK tools (aiTools), and a script plays the model,
// calling them as a model would. With the `ai` package, the same tools go
// into generateText({ model, tools, prompt }) unchanged.
//
// Against `capstan dev` (open, on 127.0.0.1:4222, or CAPSTAN_NATS_URL):
//
//   npm run build && node dist/examples/scripted-agent.js

import { connect, stringifyJSON } from "../src/index.js";
import { aiTools, resumeToolName } from "../src/ai.js";

/** One step of the script: the tool a model would call, and its arguments. */
interface Step {
  tool: string;
  input: (previous: unknown) => unknown;
}

const script: Step[] = [
  { tool: "demo_echo", input: () => ({ question: "Is capstan up?" }) },
  { tool: "demo_flaky", input: () => ({ failTimes: 5 }) }, // fails: the model sees only what it may
  { tool: "orders_refund", input: () => ({ orderId: "o-42", amount: 900 }) }, // needs an approval
  { tool: resumeToolName, input: (previous) => ({ approvalId: (previous as { approvalId: string }).approvalId }) },
];

export async function main(servers?: string, print: (line: string) => void = console.log): Promise<unknown[]> {
  const capstan = await connect({ servers, surface: "mcp", actor: { kind: "agent", id: "scripted" } });
  try {
    const tools = await aiTools(capstan);
    print(`tools: ${Object.keys(tools).join(", ")}`);
    const results: unknown[] = [];
    let previous: unknown;
    for (const [i, step] of script.entries()) {
      const tool = tools[step.tool];
      if (tool === undefined) throw new Error(`no tool ${step.tool}`);
      if (step.tool === resumeToolName) {
        // A person, not the model, approves: on an open server the decision names its approver.
        const approvalId = (previous as { approvalId: string }).approvalId;
        await capstan.approvals.decide(approvalId, { approve: true, approver: { kind: "user", id: "finance-lead" }, comment: "ok" });
        print(`(a person approved ${approvalId})`);
      }
      const input = step.input(previous);
      previous = await tool.execute(input, { toolCallId: `call-${i}`, abortSignal: AbortSignal.timeout(60_000) });
      results.push(previous);
      print(`${step.tool}(${stringifyJSON(input)}) -> ${stringifyJSON(previous)}`);
    }
    return results;
  } finally {
    await capstan.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exitCode = 1;
  });
}
