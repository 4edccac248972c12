"""KV-cached incremental decoding vs full recompute per token in ``LocalTorchEngine`` (tokens/s, one CPU thread).

    python bench/bench_kv_cache.py [--prompt 64] [--new 192] [--reps 3]

Prints both paths side by side and the speed-up; the sampled tokens must be identical (same seed).
"""

from __future__ import annotations

import argparse
import time

import torch

from sapwood.learner.model import TinyActorCritic, TinyTransformerConfig
from sapwood.rollout.engines import SamplingParams
from sapwood.rollout.torch_engine import LocalTorchEngine


def tokens_per_s(engine: LocalTorchEngine, prompt: list[int], sp: SamplingParams, reps: int) -> tuple[float, list[int]]:
    best = float("inf")
    out: list[int] = []
    for _ in range(reps):
        engine.generator.manual_seed(0)
        t0 = time.perf_counter()
        out = engine.generate(prompt, sp).output_ids.tolist()
        best = min(best, time.perf_counter() - t0)
    return len(out) / best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", type=int, default=192)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = TinyTransformerConfig(vocab_size=256, d_model=64, n_heads=4, n_layers=2, d_ff=256,
                                max_position=args.prompt + args.new)
    torch.manual_seed(0)
    state = TinyActorCritic(cfg).state_dict()
    prompt = [int(t) for t in torch.randint(0, cfg.vocab_size, (args.prompt,))]
    sp = SamplingParams(max_new_tokens=args.new)
    cached, out_c = tokens_per_s(LocalTorchEngine(cfg, state=state), prompt, sp, args.reps)
    full, out_f = tokens_per_s(LocalTorchEngine(cfg, state=state, kv_cache=False), prompt, sp, args.reps)
    print(f"prompt {args.prompt} + {args.new} new tokens, d_model {cfg.d_model}, {cfg.n_layers} layers, 1 thread")
    print(f"{'path':<16}{'tokens/s':>12}")
    print(f"{'kv cache':<16}{cached:>12.0f}")
    print(f"{'full recompute':<16}{full:>12.0f}")
    print(f"speed-up {cached / full:.2f}x; same tokens: {out_c == out_f}")
    if out_c != out_f:
        raise SystemExit("the cached and full-recompute paths sampled different tokens")


if __name__ == "__main__":
    main()
