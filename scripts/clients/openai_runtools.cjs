#!/usr/bin/env node
// Acceptance test of tool calling with the official openai npm package (npm install openai), run by
// runners/e2e/openai_sdk_test.go against the gateway of a real cluster:
// NODE_PATH=<dir>/node_modules node openai_runtools.cjs BASE_URL MODEL.
// Prints one JSON object with what it saw; exits non-zero on any failure.
const OpenAI = require('openai');

const [base, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0 });
const parameters = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'], additionalProperties: false };
const messages = [{ role: 'user', content: 'What is the weather in Paris?' }];

function check(cond, what) {
  if (!cond) throw new Error('check failed: ' + what);
}

(async () => {
  const out = {};
  // runTools: the SDK calls our function with the parsed arguments and sends its result back.
  const seen = [];
  const runner = client.chat.completions.runTools({
    model, temperature: 0, max_tokens: 100, messages,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    tools: [{ type: 'function', function: {
      name: 'get_weather', description: 'Current weather in a city', parameters, parse: JSON.parse,
      function: (args) => { seen.push(args); return { temperature_c: 18, sky: 'sunny' }; },
    } }],
  });
  await runner.done();
  check(seen.length === 1 && typeof seen[0].city === 'string', 'runTools called get_weather with a city: ' + JSON.stringify(seen));
  out.runtools_args = seen[0];
  out.runtools_messages = runner.messages.map((m) => m.role);

  // Streamed delta.tool_calls reassemble into the same call as the non-streamed answer.
  const req = { model, temperature: 0, max_tokens: 100, messages, tool_choice: 'required',
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Current weather in a city', parameters } }] };
  const whole = await client.chat.completions.create(req);
  const stream = client.chat.completions.stream({ ...req, stream: true });
  const streamed = await stream.finalChatCompletion();
  const pick = (c) => c.choices[0].message.tool_calls.map((t) => [t.function.name, t.function.arguments]);
  check(whole.choices[0].finish_reason === 'tool_calls', 'finish_reason ' + whole.choices[0].finish_reason);
  out.whole = pick(whole);
  out.streamed = pick(streamed);
  check(JSON.stringify(out.whole) === JSON.stringify(out.streamed), 'streamed call differs');
  console.log(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
