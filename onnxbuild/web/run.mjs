// Runs one ONNX model in onnxruntime-web (wasm backend) under Node.js, for onnxbuild's
// validate and benchmark steps. Usage: node run.mjs JOB.json
// JOB: {model, threads, warmup, iterations, inputs: [{name, dtype, dims, file}], out}
// Writes OUT/result.json: {outputs: [{name, dtype, dims, file}], times_ms: [...]}, with
// each output's raw little-endian bytes in OUT/<index>.bin. Errors go to result.json too.
import fs from 'node:fs';
import path from 'node:path';
import * as ort from 'onnxruntime-web';

const ARRAYS = {
  float32: Float32Array, float64: Float64Array, int32: Int32Array, int64: BigInt64Array,
  uint8: Uint8Array, int8: Int8Array, bool: Uint8Array, float16: Uint16Array, uint16: Uint16Array, int16: Int16Array,
};

function tensor(spec) {
  const bytes = fs.readFileSync(spec.file);
  const Kind = ARRAYS[spec.dtype];
  if (!Kind) throw new Error(`input ${spec.name}: dtype ${spec.dtype} is not supported by this runner`);
  const copy = new Uint8Array(bytes.byteLength);
  copy.set(bytes);
  return new ort.Tensor(spec.dtype, new Kind(copy.buffer), spec.dims);
}

const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const result = { outputs: [], times_ms: [], error: null };
try {
  ort.env.wasm.numThreads = job.threads || 1;
  ort.env.logLevel = 'error';
  const session = await ort.InferenceSession.create(new Uint8Array(fs.readFileSync(job.model)), { executionProviders: ['wasm'] });
  const feeds = {};
  for (const spec of job.inputs) feeds[spec.name] = tensor(spec);
  let outputs = await session.run(feeds);
  for (let i = 0; i < (job.warmup || 0); i++) outputs = await session.run(feeds);
  for (let i = 0; i < (job.iterations || 0); i++) {
    const t0 = process.hrtime.bigint();
    outputs = await session.run(feeds);
    result.times_ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  session.outputNames.forEach((name, i) => {
    const t = outputs[name];
    const file = path.join(job.out, `${i}.bin`);
    fs.writeFileSync(file, Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength));
    result.outputs.push({ name, dtype: t.type, dims: t.dims, file });
  });
} catch (err) {
  result.error = String(err && err.message ? err.message : err).split('\n').slice(0, 3).join(' ');
}
fs.writeFileSync(path.join(job.out, 'result.json'), JSON.stringify(result));
