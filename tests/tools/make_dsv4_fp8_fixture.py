#!/usr/bin/env python3
"""Makes tests/fixtures/dsv4-tiny-fp8: dsv4-tiny's linear weights in DeepSeek's FP8 block format (float8
e4m3 with float32 `weight_scale_inv`, one scale per BLOCK x BLOCK block: w = fp8 * scale_inv), and the
reference that transformers' deepseek_v4 computes on exactly the dequantized weights (float32, CPU,
eager attention), for the same prompts as dsv4-tiny. This is how the V3 FP8 fixture was made: the
reference runs the dequantized model, so the engine's FP8 loading is judged by transformers.

Quantized: every attention projection (wq_a, wq_b, wkv, wo_a, wo_b, the compressors' wkv / wgate, the
indexer's wq_b and its compressor's) and every expert's and shared expert's w1 / w2 / w3. Kept as they
are (the publisher keeps them in higher precision): embeddings, head, norms, router gate and bias,
hyper-connection tensors, position biases, sinks, the indexer's weights_proj, tid2eid.

usage: make_dsv4_fp8_fixture.py SRC_DIR OUT_DIR [BLOCK]   (needs torch, safetensors, transformers)
BLOCK defaults to 32 so the tiny model's grouped output projection (o_lora_rank 32) splits on block
boundaries, as the full model's (1024) does with 128.
"""
import json
import math
import os
import re
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

QUANTIZED = re.compile(r"\.(attn\.(wq_a|wq_b|wkv|wo_a|wo_b|compressor\.(wkv|wgate)|indexer\.(wq_b|compressor\.(wkv|wgate)))"
                       r"|ffn\.(experts\.\d+|shared_experts)\.w[123])\.weight$")


def quantize(w, block):
    """w [O, I] -> (fp8 [O, I], scale_inv f32 [ceil(O/B), ceil(I/B)], dequantized f32 [O, I])."""
    w = w.float()
    O, I = w.shape
    so, si = math.ceil(O / block), math.ceil(I / block)
    q = torch.empty(O, I, dtype=torch.float8_e4m3fn)
    scale = torch.empty(so, si, dtype=torch.float32)
    deq = torch.empty(O, I, dtype=torch.float32)
    for bo in range(so):
        for bi in range(si):
            blk = w[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block]
            s = (blk.abs().max() / 448.0).clamp(min=1e-12)
            qb = (blk / s).to(torch.float8_e4m3fn)
            q[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block] = qb
            scale[bo, bi] = s
            deq[bo * block:(bo + 1) * block, bi * block:(bi + 1) * block] = qb.float() * s
    return q, scale, deq


def main():
    src, out = sys.argv[1], sys.argv[2]
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    os.makedirs(out, exist_ok=True)
    sd = load_file(os.path.join(src, "model.safetensors"))
    fp8, deq = {}, {}
    for k, v in sd.items():
        if QUANTIZED.search(k):
            q, s, d = quantize(v, block)
            fp8[k] = q
            fp8[k[: -len("weight")] + "weight_scale_inv"] = s
            deq[k] = d
        else:
            fp8[k] = v
            deq[k] = v.float() if v.is_floating_point() else v
    save_file(fp8, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block]}
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=2)

    # The reference model: the source checkpoint's layout with the dequantized values, in float32.
    tmp = os.path.join(out, ".dequantized")
    os.makedirs(tmp, exist_ok=True)
    save_file(deq, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    plain = json.load(open(os.path.join(src, "config.json")))
    plain["torch_dtype"] = "float32"
    json.dump(plain, open(os.path.join(tmp, "config.json"), "w"), indent=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tmp, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    ref_src = load_file(os.path.join(src, "reference.safetensors"))
    ref, prompts = {}, []
    with torch.no_grad():
        i = 0
        while f"prompt_{i}" in ref_src:
            ids = ref_src[f"prompt_{i}"]
            logits = model(ids[None, :]).logits[0].float()
            ref[f"prompt_{i}"] = ids
            ref[f"logit_pos_{i}"] = torch.arange(ids.numel(), dtype=torch.int64)
            ref[f"logits_{i}"] = logits.contiguous()
            seq, greedy, margin = ids.clone(), [], []
            for _ in range(12):
                last = model(seq[None, :]).logits[0, -1].float()
                top = torch.topk(last, 2)
                greedy.append(int(top.indices[0]))
                margin.append(float(top.values[0] - top.values[1]))
                seq = torch.cat([seq, top.indices[:1]])
            ref[f"greedy_{i}"] = torch.tensor(greedy, dtype=torch.int64)
            ref[f"margin_{i}"] = torch.tensor(margin, dtype=torch.float32)
            prompts.append({"prompt": i, "length": int(ids.numel()), "min_greedy_margin": min(margin)})
            i += 1
    save_file(ref, os.path.join(out, "reference.safetensors"), metadata={"format": "pt"})
    import transformers
    json.dump({
        "made_by": f"tests/tools/make_dsv4_fp8_fixture.py from dsv4-tiny: transformers {transformers.__version__} "
                   f"(deepseek_v4), torch {torch.__version__}, float32 on CPU, eager attention",
        "weights": f"attention projections and experts in FP8 e4m3 with float32 weight_scale_inv per {block}x{block} "
                   "block; the reference ran in float32 on exactly the dequantized values (fp8 * scale_inv)",
        "quantized": sorted(k for k in sd if QUANTIZED.search(k)),
        "prompts": prompts,
        "tensors": "as dsv4-tiny: prompt_<i>, logits_<i> at every position, greedy_<i> (12 tokens, full re-forward "
                   "each step), margin_<i>",
    }, open(os.path.join(out, "reference.json"), "w"), indent=2)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)
    print("wrote", out, "with", len(ref) // 5, "prompts;", sum(1 for k in sd if QUANTIZED.search(k)), "FP8 tensors")


if __name__ == "__main__":
    main()
