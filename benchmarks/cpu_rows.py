"""The engine's CPU row kernels (engine/cpu/cpu_rows.py) against aten's paths, op by op, on the real
model's weights: SmolLM2-135M's 120 decoder Linear layers in int4 (Q4_1 x Q8_1 against
`aten._weight_int4pack_mm_for_cpu`), its lm_head in int8 (Q8 x Q8 against `aten._weight_int8pack_mm`),
and 30 layers of one request's attention rows (one call for all rows against one SDPA call per row,
the engine's batch-invariant path without the kernel), at 1-16 rows. Every weight streams from
memory once per timed call, as in a served step; the two paths alternate call by call; medians.

    python benchmarks/cpu_rows.py [--reps 9] [--threads 2] [--contexts 200,1000]

Prints a table and writes benchmarks/results/cpu_rows.json.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from common import ROOT, load_target_format, timed, write_result

ROWS = (1, 2, 4, 8, 16)


def linears_fn(model, kind: str, rows: int):
    from sglang_dspark.engine.cpu.quantized_linear import Int4Linear

    layers = [m for m in model.modules() if isinstance(m, Int4Linear)] if kind == "int4" else [model.lm_head]
    xs = {m.in_features: torch.randn(rows, m.in_features).bfloat16() for m in layers}

    def run():
        with torch.inference_mode():
            for m in layers:
                m(xs[m.in_features])
    return run


def attention_fn(model, kernel: bool, rows: int, context: int):
    """30 layers of one request's `rows` verify rows after `context` cached tokens."""
    cfg = model.config
    H, KVH, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    cache = model.new_kv_cache(1, context + rows)
    g = torch.Generator().manual_seed(0)
    kv = [torch.randn(cache.kv[i].shape, generator=g).bfloat16() for i in range(cfg.num_hidden_layers)]
    q = torch.randn(rows, H, hd, generator=g).bfloat16()
    slots, keys = torch.zeros(rows, dtype=torch.long), torch.arange(context + 1, context + rows + 1)

    def run():
        for layer_kv in kv:
            if kernel:
                model.row_kernels.rows_attention(q, layer_kv, slots, keys, hd ** -0.5)
            else:  # target_model._one_request_attention's per-row calls
                k, v = layer_kv[0, 0], layer_kv[1, 0]
                torch.cat([F.scaled_dot_product_attention(q[i].view(1, KVH, H // KVH, hd), k[None, :, : keys[i]],
                                                          v[None, :, : keys[i]]) for i in range(rows)])
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="target directory or zoo name")
    ap.add_argument("--reps", type=int, default=9, help="timed calls per case and path")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--contexts", default="200,1000", help="cached tokens before the attention rows")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_rows.json"), help="JSON output")
    args = ap.parse_args()
    from sglang_dspark import zoo
    from sglang_dspark.engine.cpu import cpu_rows
    from sglang_dspark.profile.fingerprint import hardware_id

    if cpu_rows.ops() is None:
        raise SystemExit(f"the row kernels do not run here: {cpu_rows.status()}")
    torch.set_num_threads(args.threads)
    path = zoo.resolve_model(args.model)
    ours, aten = load_target_format(path, "int4"), load_target_format(path, "int4+aten")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    rows = []
    print(f"{'op':<24} {'rows':>4} {'aten ms':>8} {'ours ms':>8} {'aten / ours':>11}")
    for op in ["int4 decoder Linear", "int8 lm_head"] + [f"attention, {c} keys" for c in contexts]:
        for n in ROWS:
            if op.startswith("attention"):
                context = int(op.split(", ")[1].split()[0])
                fns = {"aten": attention_fn(ours, False, n, context), "ours": attention_fn(ours, True, n, context)}
            else:
                kind = "int4" if op.startswith("int4") else "int8"
                fns = {"aten": linears_fn(aten, kind, n), "ours": linears_fn(ours, kind, n)}
            t = timed(fns, args.reps)
            rows.append({"op": op, "rows": n, "aten_ms": round(t["aten"], 3), "ours_ms": round(t["ours"], 3),
                         "aten_over_ours": round(t["aten"] / t["ours"], 3)})
            print(f"{op:<24} {n:>4} {t['aten']:>8.2f} {t['ours']:>8.2f} {t['aten'] / t['ours']:>11.2f}", flush=True)
    write_result(args.out, {"benchmark": "cpu_rows", "model": args.model, "hardware": hardware_id(),
                            "threads": args.threads, "reps": args.reps, "torch": torch.__version__,
                            "statistic": "median ms per call over the model's layers, paths interleaved",
                            "rows": rows})


if __name__ == "__main__":
    main()
