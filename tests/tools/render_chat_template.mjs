// Reference chat-template rendering for tests/recipe: Hugging Face's own Jinja implementation
// (@huggingface/jinja, what transformers.js uses for apply_chat_template).
// stdin:  {"template": str, "context": {...}, "cases": [{...per-case variables...}, ...]}
// stdout: [{"text": str} | {"error": str}, ...] — one entry per case, context merged under each case.
import { Template } from "@huggingface/jinja";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const req = JSON.parse(input);
let template = null;
let parseError = null;
try {
  template = new Template(req.template);
} catch (e) {
  parseError = String(e && e.message ? e.message : e);  // every case fails alike
}
const out = req.cases.map((c) => {
  if (parseError !== null) return { error: parseError };
  try {
    return { text: template.render({ ...(req.context ?? {}), ...c }) };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(out));
