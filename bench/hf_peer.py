"""The Hugging Face transformers peer for `beluga bench model --device cuda`: DeepseekV2ForCausalLM
from the same config, random bf16 weights made on the GPU, `generate` with its default cache.
Prints prefill tokens/s (one forward over a prompt) and decode tokens/s (generate N new tokens after
a prompt, minus the prefill time) for the given shapes, within a wall-clock budget."""
import argparse
import json
import sys
import time

import torch
import transformers
from transformers import AutoConfig, DeepseekV2ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--decode", default="1x1024,16x1024")  # batch x context
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--budget-s", type=float, default=150)
    a = ap.parse_args()
    start = time.time()
    cfg = AutoConfig.for_model("deepseek_v2", **{k: v for k, v in json.load(open(a.config)).items()
                                               if k not in ("auto_map", "architectures", "model_type")})
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV2ForCausalLM(cfg)
    model.eval()
    n = sum(p.numel() for p in model.parameters())
    print(f"hf peer: transformers {transformers.__version__}, torch {torch.__version__}, {n / 1e9:.2f} B params, "
          f"build {time.time() - start:.1f} s, attn {model.config._attn_implementation}", flush=True)
    V = cfg.vocab_size
    rows = []

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.time()
        out = fn()
        torch.cuda.synchronize()
        return time.time() - t0, out

    with torch.no_grad():
        timed(lambda: model(torch.randint(0, V, (1, 64), device="cuda")))  # warm-up
        for P in [int(x) for x in a.prefill.split(",") if x]:
            if time.time() - start > a.budget_s:
                print(f"prefill {P}: skipped (budget)", flush=True)
                continue
            ids = torch.randint(0, V, (1, P), device="cuda")
            t, _ = timed(lambda: model(ids, logits_to_keep=1))
            t, _ = timed(lambda: model(ids, logits_to_keep=1))
            rows.append(("prefill", 1, P, P / t, t * 1e3))
            print(f"prefill {P}: {P / t:.1f} tok/s ({t * 1e3:.1f} ms)", flush=True)
        for spec in [x for x in a.decode.split(",") if x]:
            B, C = (int(v) for v in spec.split("x"))
            if time.time() - start > a.budget_s:
                print(f"decode {spec}: skipped (budget)", flush=True)
                continue
            ids = torch.randint(0, V, (B, C), device="cuda")
            mask = torch.ones_like(ids)
            gen = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
            tp, _ = timed(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, **gen))
            tg, _ = timed(lambda: model.generate(ids, attention_mask=mask, max_new_tokens=a.new_tokens + 1,
                                                 min_new_tokens=a.new_tokens + 1, **gen))
            step = (tg - tp) / a.new_tokens
            rows.append(("decode", B, C, B / step, step * 1e3))
            print(f"decode b={B} ctx={C}: {B / step:.1f} tok/s ({step * 1e3:.2f} ms/step)", flush=True)
    print("\nHF transformers peer (bf16, eager generate):")
    print(f"{'phase':8} {'batch':>6} {'context':>8} | {'tokens/s':>10} {'ms/step':>10}")
    for r in rows:
        print(f"{r[0]:8} {r[1]:6d} {r[2]:8d} | {r[3]:10.1f} {r[4]:10.2f}")


if __name__ == "__main__":
    sys.exit(main())
