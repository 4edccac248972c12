"""Calibrates the cells' device costs from the demo model's real computation (one CPU thread).

    python bench/bench_device_costs.py [--decode-token-s 0.01] [--k 2] [--tokens 96] [--reps 40]

Measures, side by side on the elastic demo's ``TinyActorCritic``: one decode step (1 token over a
KV cache of half the context), one step feeding ``k`` tokens at once (the batched-step stand-in: the engine
decodes one sequence per call, so a ``k``-row matmul is what a batch of ``k`` adds), and one training
micro-batch (forward + backward over ``--tokens`` packed tokens, as a micro-batch of the SAO step
runs the batch's tree forward; here block-causal sequences of ``max_position`` − 16 tokens).
Prints the ratios and the device costs they give when one decode token is pinned at
``--decode-token-s`` (the demo's device scale): ``batch_extra_s`` = decode × (t_k − t_1) / ((k − 1) t_1),
``train_microbatch_s`` = decode × t_mb / t_1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from sapwood.demo.config import DemoConfig
from sapwood.learner.model import TinyActorCritic


def median_s(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--decode-token-s", type=float, default=0.01)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = DemoConfig().model_config()
    torch.manual_seed(0)
    model = TinyActorCritic(cfg)
    prompt = torch.randint(0, cfg.vocab_size, (cfg.max_position // 2,))
    with torch.inference_mode():
        _, past = model.actor_step(prompt)
    one = torch.randint(0, cfg.vocab_size, (1,))
    k_tokens = torch.randint(0, cfg.vocab_size, (args.k,))

    def decode(tokens: torch.Tensor) -> Callable[[], object]:
        def run() -> object:
            with torch.inference_mode():
                return model.actor_step(tokens, past)
        return run

    n, seq = args.tokens, cfg.max_position - 16  # packed sequences of max_position - 16 tokens, block-causal
    toks = torch.randint(0, cfg.vocab_size, (n,))
    pos = torch.arange(n) % seq
    block = torch.arange(n) // seq
    mask = (block[:, None] == block[None, :]) & torch.ones(n, n, dtype=torch.bool).tril()

    def micro_batch() -> object:
        model.zero_grad(set_to_none=True)
        logits, values = model(toks, pos, mask)
        (logits.logsumexp(-1).mean() + values.square().mean()).backward()
        return None

    t1 = median_s(decode(one), args.reps)
    tk = median_s(decode(k_tokens), args.reps)
    tmb = median_s(micro_batch, max(args.reps // 4, 3))
    d = args.decode_token_s
    extra = d * max(tk - t1, 0.0) / ((args.k - 1) * t1)
    train = d * tmb / t1
    print(f"model d_model={cfg.d_model} layers={cfg.n_layers} vocab={cfg.vocab_size}; one thread")
    print(f"decode 1 token: {t1 * 1e3:.3f} ms   {args.k} tokens: {tk * 1e3:.3f} ms   "
          f"micro-batch ({n} tokens fwd+bwd): {tmb * 1e3:.2f} ms")
    print(f"ratios: t_k/t_1 = {tk / t1:.2f}   t_mb/t_1 = {tmb / t1:.1f}")
    print(f"device costs at decode_token_s={d}: batch_extra_s={extra:.4f} train_microbatch_s={train:.3f}")


if __name__ == "__main__":
    main()
