// Drives the coordinator's OpenAI-compatible API with the official `openai`
// npm package (scripts/install_openai_node.sh), as a user's Node.js code
// would: a streamed chat completion and a streamed completion (both reading
// usage from the include_usage chunk), a non-streamed chat completion, and
// one bad request. Prints one JSON object with what the client saw.
//   node openai_client.cjs BASE_URL MODEL PROMPT USER_MESSAGE MAX_TOKENS
// The package is found at $LEDE_OPENAI_NODE_MODULES.
const path = require('path');
const { OpenAI } = require(path.join(process.env.LEDE_OPENAI_NODE_MODULES, 'openai'));

async function main() {
  const [baseURL, model, prompt, userMessage, maxTokensText] = process.argv.slice(2);
  const maxTokens = Number(maxTokensText);
  const client = new OpenAI({ baseURL, apiKey: 'not-needed', maxRetries: 0 });
  const out = {};

  const chat = { text: '', role: null, finish_reason: null, usage: null, chunks: 0 };
  const chatStream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: userMessage }], max_tokens: maxTokens,
    temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of chatStream) {
    chat.chunks++;
    if (chunk.usage) chat.usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) chat.role = c.delta.role;
      if (c.delta.content) chat.text += c.delta.content;
      if (c.finish_reason) chat.finish_reason = c.finish_reason;
    }
  }
  out.chat_stream = chat;

  const completion = { text: '', finish_reason: null, usage: null, chunks: 0 };
  const completionStream = await client.completions.create({
    model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of completionStream) {
    completion.chunks++;
    if (chunk.usage) completion.usage = chunk.usage;
    for (const c of chunk.choices) {
      completion.text += c.text;
      if (c.finish_reason) completion.finish_reason = c.finish_reason;
    }
  }
  out.completion_stream = completion;

  const whole = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: userMessage }], max_tokens: maxTokens, temperature: 0,
  });
  out.chat = {
    text: whole.choices[0].message.content, finish_reason: whole.choices[0].finish_reason,
    usage: whole.usage, timings: whole.timings, lede: whole.lede,
  };

  try {
    await client.completions.create({ model, prompt, max_tokens: 0 });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, type: e.type, param: e.param, message: e.message };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
