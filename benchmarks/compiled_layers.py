"""Would `torch.compile` cut the non-GEMM time of a reference-engine step? The CPU analogue of a
CUDA-graph capture, tried on the real model before building it into the engine.

The decoder layer's dense parts (RMSNorm, the fused q/k/v projection, RoPE; then o_proj, the
residual, RMSNorm and the MLP) are compiled by inductor with dynamic token counts; attention and
the KV-cache write stay eager (their shapes change with every context length). Reported, against
the eager layer (what the engine runs), interleaved, medians of `--reps`:

- the compile time (first calls at every step width),
- the step time at T = 1, 2, 8, 16 new tokens over a 200-token context, R = 1,
- the largest logit difference from eager, and whether the argmax agrees: the engine's promise is
  greedy output equal to transformers' token for token, so any difference at all is a cost;
- a third arm, `split_rope`: the layer as it was before q and k shared one rotation (two
  chunk-and-cat rotate_halfs), to measure that change side by side (its logits must be equal).

    python benchmarks/compiled_layers.py [--dtype bfloat16] [--reps 9] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

# a cold compile, as on a fresh host: inductor's caches in a directory of this run's own
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="compiled_layers_"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = (1, 2, 8, 16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="weight format")
    parser.add_argument("--reps", type=int, default=9, help="interleaved timings per width and arm")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/compiled_layers.json"), help="JSON output path")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor_config

    from sglang_dspark import zoo
    from sglang_dspark.engine import target_model as tm

    inductor_config.emulate_precision_casts = True  # round intermediates as eager does, where it can
    model = tm.TargetModel.from_pretrained(zoo.resolve_model(args.model), weight_format=args.dtype)
    cache = model.new_kv_cache(1, 1024)
    context = torch.randint(0, 1000, (200,), generator=torch.Generator().manual_seed(0))
    model.forward_segments([tm.Segment(0, 0, context)], cache)

    def dense_in(layer, x, cos, signed_sin, index):
        T, H, KVH, hd = x.shape[0], layer.num_heads, layer.num_kv_heads, layer.head_dim
        qkv = layer.qkv_proj(layer.attn_norm(x))
        qk = tm._apply_rope_signed(qkv[:, : (H + KVH) * hd].view(T, H + KVH, hd), cos, signed_sin, index)
        v = qkv[:, (H + KVH) * hd :].view(T, KVH, hd)
        return qk[:, :H], torch.stack((qk[:, H:], v), dim=1)

    def dense_out(layer, x, attn):
        x = x + layer.o_proj(attn)
        gate, up = layer.gate_up_proj(layer.mlp_norm(x)).chunk(2, dim=-1)
        return x + layer.down_proj(F.silu(gate) * up)

    compiled_in, compiled_out = torch.compile(dense_in, dynamic=True), torch.compile(dense_out, dynamic=True)
    eager_forward = tm.DecoderLayer.forward

    def compiled_forward(layer, x, layer_kv, b):
        q, kv = compiled_in(layer, x, b.cos, b.signed_sin, b.rotate_index)
        layer_kv[:, b.token_slots, :, b.positions] = kv
        return compiled_out(layer, x, layer._attention(q, layer_kv, b))

    def split_rope_forward(layer, x, layer_kv, b):
        """The layer as it was before q and k shared one rotation: rotate_half by chunk and cat, twice."""
        T, H, KVH, hd = x.shape[0], layer.num_heads, layer.num_kv_heads, layer.head_dim
        q, k, v = layer.qkv_proj(layer.attn_norm(x)).split([H * hd, KVH * hd, KVH * hd], dim=-1)
        q, k, v = q.view(T, H, hd), k.view(T, KVH, hd), v.view(T, KVH, hd)
        sin = b.signed_sin * sign  # the plain sine table again

        def rope(t):
            t1, t2 = t.chunk(2, dim=-1)
            return t * b.cos + torch.cat((-t2, t1), dim=-1) * sin

        q, k = rope(q), rope(k)
        layer_kv[:, b.token_slots, :, b.positions] = torch.stack((k, v), dim=1)
        x = x + layer.o_proj(layer._attention(q, layer_kv, b))
        gate, up = layer.gate_up_proj(layer.mlp_norm(x)).chunk(2, dim=-1)
        return x + layer.down_proj(F.silu(gate) * up)

    sign = model.rope_sign.to(model.dtype)
    arms = {"eager": eager_forward, "compiled": compiled_forward, "split_rope": split_rope_forward}

    def step(width: int) -> torch.Tensor:
        return model.forward_segments([tm.Segment(0, 200, context[:width])], cache).logits

    logits, warm_s = {}, {}
    for name, forward in arms.items():
        tm.DecoderLayer.forward = forward
        start = time.perf_counter()
        for width in WIDTHS:
            logits[name, width] = step(width)
        warm_s[name] = time.perf_counter() - start
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.reps):
        for name, forward in arms.items():
            tm.DecoderLayer.forward = forward
            for width in WIDTHS:
                start = time.perf_counter()
                step(width)
                times.setdefault((name, width), []).append(time.perf_counter() - start)
    tm.DecoderLayer.forward = eager_forward

    rows = []
    print(f"first calls (compile): eager {warm_s['eager']:.1f} s, compiled {warm_s['compiled']:.1f} s")
    print(f"{'T':>3} {'eager ms':>9} {'compiled ms':>12} {'eager/compiled':>15} {'max |dlogit|':>13} {'argmax same':>12}"
          f" {'split-RoPE ms':>14} {'split/eager':>12} {'split == eager':>15}")
    for width in WIDTHS:
        eager, comp, split = (statistics.median(times[a, width]) * 1e3 for a in arms)
        diff = float((logits["eager", width] - logits["compiled", width]).abs().max())
        same = bool((logits["eager", width].argmax(-1) == logits["compiled", width].argmax(-1)).all())
        split_equal = bool(torch.equal(logits["eager", width], logits["split_rope", width]))
        rows.append({"tokens": width, "eager_ms": round(eager, 2), "compiled_ms": round(comp, 2),
                     "speedup": round(eager / comp, 3), "max_abs_logit_diff": diff, "argmax_equal": same,
                     "split_rope_ms": round(split, 2), "split_rope_over_eager": round(split / eager, 3),
                     "split_rope_logits_equal": split_equal})
        print(f"{width:>3} {eager:>9.1f} {comp:>12.1f} {eager / comp:>15.2f} {diff:>13.4f} {str(same):>12}"
              f" {split:>14.1f} {split / eager:>12.3f} {str(split_equal):>15}")
    out = {"benchmark": "compiled_layers", "model": args.model, "dtype": args.dtype, "threads": args.threads,
           "reps": args.reps, "compile_s": round(warm_s["compiled"], 1), "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
