// Measures llama.cpp (through node-llama-cpp's prebuilt CPU binary) on a GGUF:
// pp = prompt tokens/s for one prompt of P tokens, tg = generation tokens/s for
// N greedy tokens after a short prompt; median of R repeats after one untimed
// warm-up pass, like llama-bench.
// Each generation step computes the token's logits (and samples nothing, as
// hearth bench does), as a decoder must: a step that asks for no output lets llama.cpp
// skip the last layer's feed-forward, the final norm and the output matrix
// (a quarter of a 1B model's bytes). LOGITS=0 measures that cheaper step.
// Prints one JSON line: {"pp_tps", "tg_tps", "threads", "logits", "model"}.
//   node bench/cpu/llamacpp_bench.mjs MODEL.gguf THREADS [P=512] [N=128] [R=3]
import {getLlama} from "node-llama-cpp";

const [model_path, threads_s, p_s = "512", n_s = "128", r_s = "3"] = process.argv.slice(2);
const threads = +threads_s, P = +p_s, N = +n_s, R = +r_s;
const logits = process.env.LOGITS !== "0";
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: model_path, useMmap: true});
const median = (xs) => xs.slice().sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const vocab = model.fileInfo.metadata.tokenizer.ggml.tokens.length;
const prompt = Array.from({length: P}, (_, i) => 300 + ((i * 7919) % (vocab - 400)));

{ // warm-up: the first pass over freshly mapped weights is slower
  const ctx = await model.createContext({contextSize: P + N + 16, threads, batchSize: P, sequences: 1, batching: {dispatchSchedule: "nextTick"}});
  const seq = ctx.getSequence();
  await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, Math.min(P, 32)));
  await seq.evaluateWithoutGeneratingNewTokens([301]);
  await ctx.dispose();
}
const pp = [], tg = [];
for (let r = 0; r < R; r++) {
  const ctx = await model.createContext({contextSize: P + N + 16, threads, batchSize: P, sequences: 1, batching: {dispatchSchedule: "nextTick"}});
  const seq = ctx.getSequence();
  let t0 = process.hrtime.bigint();
  await seq.evaluateWithoutGeneratingNewTokens(prompt);
  pp.push(P / (Number(process.hrtime.bigint() - t0) / 1e9));
  await ctx.dispose();

  // Generation: one token per decode step, as llama-bench's tg does (no sampling cost).
  const ctx2 = await model.createContext({contextSize: P + N + 16, threads, batchSize: P, sequences: 1, batching: {dispatchSchedule: "nextTick"}});
  const seq2 = ctx2.getSequence();
  await seq2.evaluateWithoutGeneratingNewTokens([1]);
  t0 = process.hrtime.bigint();
  for (let i = 0; i < N; i++) {
    const tok = 300 + ((i * 31) % (vocab - 400));
    // _noSampling: node-llama-cpp's own switch (its embedding context uses it)
    // for "decode with the last token's logits, sample nothing".
    if (logits) for await (const _ of seq2.evaluate([tok], {_noSampling: true}));
    else await seq2.evaluateWithoutGeneratingNewTokens([tok]);
  }
  const count = N;
  tg.push(count / (Number(process.hrtime.bigint() - t0) / 1e9));
  await ctx2.dispose();
}
console.log(JSON.stringify({pp_tps: median(pp), tg_tps: median(tg), threads, logits, model: model_path}));
await model.dispose();
